"""Speech-style features from .npy clips: a random 2 s crop, torch.stft (25 ms windows,
10 ms hop), power spectrum, an 80-band mel filterbank (built here with numpy, as
librosa's slaney mel), log; batches of 32, shuffling DataLoader, num_workers=0.

    starvecheck loader --factory benchmarks/pipelines/audio.py:mel --quick
"""

from __future__ import annotations

import numpy as np
import torch
from pipedata import RATE, ensure
from torch.utils.data import DataLoader, Dataset

BATCH = 32
CROP = 2 * RATE
N_FFT, HOP, MELS = 400, 160, 80


def mel_matrix(n_fft: int = N_FFT, mels: int = MELS, rate: int = RATE) -> np.ndarray:
    """Triangular mel filters (HTK mel scale) over the rfft bins: mels x (n_fft/2+1)."""

    def mel(f):
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def hz(m):
        return 700.0 * (10 ** (m / 2595.0) - 1.0)

    edges = hz(np.linspace(mel(0.0), mel(rate / 2), mels + 2))
    bins = np.linspace(0, rate / 2, n_fft // 2 + 1)
    out = np.zeros((mels, bins.size), np.float32)
    for m in range(mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        up = (bins - lo) / (mid - lo)
        down = (hi - bins) / (hi - mid)
        out[m] = np.maximum(0, np.minimum(up, down)) * 2.0 / (hi - lo)
    return out


class Clips(Dataset):
    def __init__(self, files: list[str]) -> None:
        self.files = files
        self.window = torch.hann_window(N_FFT)
        self.mel = torch.from_numpy(mel_matrix())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> torch.Tensor:
        clip = np.load(self.files[i], mmap_mode="r")
        start = np.random.randint(0, len(clip) - CROP)
        x = torch.from_numpy(np.array(clip[start : start + CROP]))
        spec = torch.stft(x, N_FFT, HOP, window=self.window, return_complex=True)
        power = spec.abs() ** 2
        return torch.log(self.mel @ power + 1e-6)


def mel() -> DataLoader:
    files = sorted(str(p) for p in ensure("audio").glob("*.npy"))
    return DataLoader(Clips(files), batch_size=BATCH, shuffle=True, num_workers=0)
