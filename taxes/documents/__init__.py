"""Result documents: building, schema, provenance, files in and out, and the checks and statistics read from them."""
