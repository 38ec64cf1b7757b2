"""7. The records: the schema, a run's record made and written, and the store that reads them."""
