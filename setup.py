"""Packaging for tfdtape: all of its metadata (pyproject.toml only names the
build backend).

TensorFlow is not in install_requires: pip would pull a second TensorFlow in
beside an installed tensorflow-cpu. Pick the distribution with an extra:
`pip install tfdtape[cpu]` or `pip install tfdtape[tensorflow]`.
"""

import pathlib
import runpy

import setuptools

_HERE = pathlib.Path(__file__).parent
_VERSIONS = runpy.run_path(str(_HERE / "tfdtape" / "versions.py"))
_TENSORFLOW = _VERSIONS["TENSORFLOW_REQUIREMENT"]

setuptools.setup(
    name="tfdtape",
    version=_VERSIONS["RELEASE"],
    description=("Gradient tapes that watch tf.distribute variables: "
                 "TensorFlow's 'Make defun work under distributed strategies' "
                 "as a patch of installed TensorFlow."),
    long_description=(_HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=["tfdtape", "tfdtape.cli", "tfdtape.horovod", "tfdtape.horovod.keras",
              "tfdtape.launchers"],
    # Declared, though it is the default, so that an editable install is a
    # plain path entry, as before PEP 660, rather than an import finder on
    # sys.meta_path ahead of the one `tfdtape run` puts there.
    package_dir={"": "."},
    py_modules=["tfdtape_pytest"],
    entry_points={
        "console_scripts": ["tfdtape = tfdtape.__main__:main"],
        "pytest11": ["tfdtape_pytest = tfdtape_pytest"],
    },
    python_requires=">=3.10",
    install_requires=["absl-py>=1.0"],
    extras_require={
        "cpu": [f"tensorflow-cpu{_TENSORFLOW}"],
        "tensorflow": [f"tensorflow{_TENSORFLOW}"],
        "test": ["pytest>=7", "pytest-xdist>=3"],
        "mpi": ["mpi4py>=3.1"],
        "lint": ["ruff==0.17.6"],
        "release": ["build>=1", "twine>=5"],
        "docs": ["mkdocs==1.6.1"],
    },
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
