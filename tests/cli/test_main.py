"""``main``: exit codes, warnings as one line on stderr, --help and --version."""

from braintrace_conv.cli import EXIT_ERROR, main
from cli_runs import TINY


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


def test_a_nonfinite_update_with_nonfinite_raise_is_one_line_and_exit_code_1(tmp_path, capsys,
                                                                              monkeypatch):
    import numpy as np

    from braintrace_conv.training import Trainer
    def never_finite(self, grads, opt_state, params, loss):
        return params, opt_state, np.bool_(False), np.zeros(len(self._view.names), bool)

    monkeypatch.setattr(Trainer, '_candidate_update', never_finite)
    code = main(['train', *TINY, '--nonfinite', 'raise', '--out', str(tmp_path / 'run')])
    err = capsys.readouterr().err
    assert code == EXIT_ERROR
    assert err.startswith('braintrace-conv: error: update 1 (epoch 1): non-finite gradient of ')
    assert len(err.strip().splitlines()) == 1
