"""The built-in agent: its loop, its jailed tools and the model providers it talks to."""
