"""`scripts/bench NAME`: one module per benchmark; `common` holds what they share."""
