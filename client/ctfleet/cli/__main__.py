"""`python -m ctfleet.cli`, as the `ctfleet` script."""

from ctfleet.cli import main

main()
