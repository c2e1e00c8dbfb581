import sys

from vllm_doctor.cli import main

sys.exit(main())
