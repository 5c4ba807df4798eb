"""Stand-in for spaces.zero (tests only)."""
