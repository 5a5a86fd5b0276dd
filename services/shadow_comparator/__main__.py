"""`python -m services.shadow_comparator`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.shadow_comparator.app import main

if __name__ == "__main__":
    run_service(t.COMPARATOR, main)
