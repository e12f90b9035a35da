"""The parts of scripts/chaos.py: the services it starts, and what it does to them."""
