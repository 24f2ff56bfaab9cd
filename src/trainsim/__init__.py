"""trainsim."""
