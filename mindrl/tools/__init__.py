"""Tools a policy calls during a multi-turn rollout: the interface, the call parsers, the registry."""
