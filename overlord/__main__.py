import sys

from overlord.cli.main import main

sys.exit(main())
