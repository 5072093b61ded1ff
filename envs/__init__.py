"""PettingZoo environments of the suite. ``from envs import multisearch_v0``."""
