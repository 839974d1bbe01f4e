"""The round engine, transport, and audit. Never imports ``clients`` or any dataset."""
