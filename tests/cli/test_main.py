"""``main``: exit codes, warnings as one line on stderr, --help and --version."""
import pytest

from braintrace_conv.cli import main

TINY = ['--epochs', '1', '--samples', '48', '--size', '8', '--steps', '6', '--channels', '2,4',
        '--batch-size', '12', '--quiet']


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp('cli') / 'run'
    assert main(['train', *TINY, '--out', str(out)]) == 0
    return out


def test_warnings_are_one_line_on_stderr(run, capsys, monkeypatch):
    import warnings

    from braintrace_conv.training import Trainer
    original = Trainer.load_params

    def load_params(self, *args, **kwargs):
        warnings.warn('a warning\n  over two lines', RuntimeWarning)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, 'load_params', load_params)
    capsys.readouterr()
    assert main(['evaluate', '--run', str(run)]) == 0
    assert capsys.readouterr().err == 'braintrace-conv: warning: a warning over two lines\n'


def test_help_and_version(capsys):
    assert main(['train', '--help']) == 0
    text = capsys.readouterr().out
    assert all(option in text for option in ('--update-every', '--resume', '--overwrite',
                                             '--nonfinite', '--log-every', '--window',
                                             '--delay', '--cues', '--clip-norm',
                                             'delayed-bars'))
    assert main(['--version']) == 0
    assert capsys.readouterr().out.startswith('braintrace-conv ')
