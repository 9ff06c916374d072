import sys

from stabletoolbench_mirror.commands.cli import main

sys.exit(main())
