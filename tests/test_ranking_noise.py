"""benchmarks.runner_accuracy.misordered: a grid's ranking errors that exceed the runs' noise, beside Spearman."""
from benchmarks.runner_accuracy import NOISE_GAP, misordered


def run(measured: float, predicted: float) -> dict:
    return {"measured": measured, "predicted": predicted}


def test_only_pairs_measured_further_apart_than_the_noise_count_and_a_swap_of_those_is_an_error():
    tie = [run(100.0, 90.0), run(101.0, 80.0)]           # 1% apart measured: a tie, whatever the prediction says
    assert misordered(tie, NOISE_GAP) == (0, 0)
    right = [run(100.0, 80.0), run(120.0, 95.0), run(150.0, 140.0)]
    assert misordered(right, NOISE_GAP) == (0, 3)
    swapped = right + [run(200.0, 70.0)]                  # measured fastest, predicted slowest: out of order with all
    assert misordered(swapped, NOISE_GAP) == (3, 6)
