"""``python -m meshbench.cli``: the meshbench command."""

from meshbench.cli.app import main

if __name__ == "__main__":
    main()
