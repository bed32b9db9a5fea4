import sys
from pathlib import Path

# The handler module lives beside tests/, as componentize-py sees it.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
