"""Template tags of the Ray pages."""
