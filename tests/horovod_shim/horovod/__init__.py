"""A stand-in `horovod` package for running Horovod's own test files
against tfdtape.horovod (tests/test_horovod_suite.py): `horovod.tensorflow`
and the Keras modules only re-export tfdtape's; `common.util` and
`runner.util.threads` give the two helpers Horovod's test utilities import."""
