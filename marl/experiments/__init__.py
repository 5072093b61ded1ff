"""Experiment tooling: ``marl.compare`` (variants x seeds), aggregate statistics, reports and
the built-in studies."""
