"""Where a run's result document goes (`taxes profile -o`): a file (refused if it exists, unless
replacing is asked for), or a new file added to a results directory (never replacing one)."""

from __future__ import annotations

import os

from taxes.errors import TaxesError


def _is_directory(output: str) -> bool:
    return os.path.isdir(output) and not os.path.islink(output)


def check_document_output(output: str | None, force: bool) -> None:
    """Before the run: -o names a directory, or a file taxes may write (taxes.files)."""
    from taxes.files import STDOUT, check_output

    if output == STDOUT:
        raise TaxesError("-o -: the result document goes to a file or a directory; --format json prints the "
                         "document with its report on stdout")
    if output and _is_directory(output):
        return
    check_output(output, force)


def write_document(doc: dict, output: str | None, force: bool) -> str | None:
    """Write the document; returns the file written (None when no -o)."""
    from taxes.documents.results import save, save_new

    if output is None:
        return None
    if _is_directory(output):
        case = doc["cases"][0]
        stem = f"{case['workload']}_" + "_".join(f"{k}{v}" for k, v in case["shape"].items()) + f"_w{case['world']}"
        stem += f"_and_{len(doc['cases']) - 1}_more" if len(doc["cases"]) > 1 else ""
        return str(save_new(doc, output, stem))
    save(doc, output, overwrite=force)
    return output
