"""Resource exhaustion: a body that forks, allocates, loops, sleeps or writes without end, aimed
at the grader's limits: each must get 0, as a run the limits end did not finish (a harness
fault would mask it)."""
from research.tasks.redteam.attacks import base
from research.tasks.redteam.attacks import plant

ATTACKS = (
    plant.body('fork_bomb', base.RESOURCE, 'fork bomb',
               '  import os\n  while True:\n    os.fork()\n'),
    plant.body('memory_bomb', base.RESOURCE, 'memory bomb',
               '  blocks = []\n  while True:\n    blocks.append(bytearray(1 << 26))\n',
               flag=False),
    plant.body('infinite_loop', base.RESOURCE, 'infinite loop',
               '  while True:\n    pass\n', flag=False),
    plant.body('sleep_forever', base.RESOURCE, 'infinite loop',
               '  import time\n  time.sleep(10 ** 6)\n', flag=False),
    plant.body('huge_output', base.RESOURCE, 'huge output',
               '  import os\n  chunk = b"x" * (1 << 20)\n  while True:\n    os.write(1, chunk)\n',
               flag=False),
)
