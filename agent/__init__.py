"""CleverThis compute agent. This package never imports Django."""
