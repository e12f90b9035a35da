"""Typed configuration: validated once at the edge, plain objects inside."""

from dressage.config.env import ENV, EnvVar, env_bool, env_float, env_int, env_str

__all__ = ["ENV", "EnvVar", "env_bool", "env_float", "env_int", "env_str"]
