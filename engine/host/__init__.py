"""What a serving host reads and flips: the capability registry, the runtime flags, the engine's stats
and the dashboard's inspection snapshot."""
