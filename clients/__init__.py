"""The client runtime (local training, protocol phases) and the tasks it trains on."""
