"""Stand-in for spaces.zero.torch (tests only)."""
