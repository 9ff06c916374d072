import sys

from stabletoolbench_mirror.cli import main

sys.exit(main())
