"""The one exception type the user sees as a single line (the CLI exits 2 on it)."""


class TaxesError(Exception):
    """Bad input or an unusable environment, stated in one line that says what to do.

    Everything raised from user-facing code paths for reasons the user can fix is a TaxesError;
    anything else escaping to the CLI is a bug in `taxes`.
    """
