"""Run the `taxes` command from a bare checkout (the GPU machine gets the working tree, not an install):

    python benchmarks/taxes_cli.py profile ag-gemm --gpus 2 ...
"""

import _checkout  # noqa: F401  (this checkout as `taxes`, installed or not)

from taxes.cli.main import main  # noqa: E402

if __name__ == "__main__":
    main()
