"""The peak resident memory of the process, in MiB."""
import sys

import pytest

from braintrace_conv._memory import peak_rss_mib


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc/self/status')
def test_peak_rss_is_the_kernels_high_water_mark_in_mib():
    with open('/proc/self/status') as f:
        fields = dict(line.split(':', 1) for line in f)
    hwm_mib = int(fields['VmHWM'].split()[0]) / 1024          # kB
    assert peak_rss_mib() == pytest.approx(hwm_mib, rel=0.05)
