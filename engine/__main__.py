"""`python -m sasflow`."""

from sasflow.cli.main import main

main()
