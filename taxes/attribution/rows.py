"""The attribution's rows, their labels and the taxes they make up: names only, so that the reports and
the documents can name them without loading the attribution's numerical code (numpy, pandas)."""

from __future__ import annotations

from taxes.method import TAXES  # noqa: F401  (the taxes these rows make up: named here too)

IDLE_ROWS = ("launch", "host_bound", "sync", "compile", "data_loading", "graph_gaps", "queued")
ROWS = ("ideal", "compute") + IDLE_ROWS + ("start_skew", "sync_wait", "exposed_transfer", "locality", "inefficiency",
                                           "unattributed")
LABELS = {"ideal": "derived", "compute": "derived", "launch": "measured", "host_bound": "measured",
          "sync": "measured", "compile": "measured", "data_loading": "measured", "graph_gaps": "measured",
          "queued": "measured", "start_skew": "derived", "sync_wait": "measured", "exposed_transfer": "derived",
          "locality": "derived", "inefficiency": "derived", "unattributed": "derived"}
