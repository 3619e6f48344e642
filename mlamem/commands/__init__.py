"""The commands as library code: profile, validate, compare, graphs, repro-oom, plan, gate,
explain, diff and the one sweep planner; each returns its result model."""
