"""Every test process sees 8 simulated CPU devices."""
import os

_FLAG = '--xla_force_host_platform_device_count=8'
if _FLAG.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' ' + _FLAG).strip()
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
