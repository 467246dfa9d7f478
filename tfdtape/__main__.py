"""`python -m tfdtape`: the command line, `tfdtape.cli` (whose `main` the
`tfdtape` console script also runs)."""

import sys

from tfdtape.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
