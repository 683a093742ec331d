"""Settings package: `base` reads the environment, `test` adjusts it for pytest."""
