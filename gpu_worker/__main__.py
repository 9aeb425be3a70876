"""`python -m gpu_worker` (kept import-light: loader processes re-import the main module)."""

import sys

from gpu_worker.main import main

if __name__ == "__main__":
    sys.exit(main())
