"""python -m comms.run ARGS: commsrun ARGS (docs/LAUNCHING.md)."""
from .programs import commsrun

if __name__ == "__main__":
    commsrun()
