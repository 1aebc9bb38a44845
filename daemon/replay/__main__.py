import sys

from daemon.replay.cli import replay_main

sys.exit(replay_main())
