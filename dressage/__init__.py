"""Dressage."""
