"""Losses, reward post-processing, teacher rotation, the embedded trainer and slime drivers."""
