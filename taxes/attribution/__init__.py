"""The one attribution: rows per rank and window, locality, what-if, stragglers, and the analysis of any program's traces."""
