"""The command line (`python -m tfdtape verify|info|run`, the `tfdtape`
console script) and the run report, which the pytest plugin shares.

The library never imports this package: what a command learns of a program
reaches it through the event bus (`tfdtape.events`), which the library
writes to and the command's sinks read from. Nothing here is imported by
`import tfdtape`.
"""
