"""The roofline helpers of notebook 02: grouping and labelling the ops, and the figure they draw."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from flashlab.lessons.roofline import draw_roofline, op_labels  # noqa: E402


def test_ops_of_equal_intensity_share_one_label():
    labels = op_labels({"S = Q Kᵀ": 62.06, "O = P V": 62.08, "P = softmax(S)": 1.25,
                        "dS = P ∘ (dP − rowsum(dP ∘ P))": 0.67})
    assert [i for i, _, _ in labels] == [0.7, 1.2, 62.1], "one point per intensity (0.1 FLOP/byte), lowest first"
    assert labels[0][1] == "dS", "a long lone name is cut at ' ='"
    assert labels[1][1] == "P = softmax(S)", "a short lone name is kept whole"
    assert labels[2][1] == "2 matmuls: S, O" and labels[2][2] == ["S = Q Kᵀ", "O = P V"]


def test_draws_each_roof_and_each_group_once():
    fig, ax = plt.subplots()
    ops = {"S = Q Kᵀ": (62.0, 800e12), "O = P V": (62.0, 800e12), "P = softmax(S)": (1.5, 67e12)}
    draw_roofline(ax, 4.3e12, {"tensor cores": 800e12, "fp32": 67e12}, ops)
    assert [line.get_label() for line in ax.get_lines()[:2]] == ["tensor cores", "fp32"]
    points = ax.get_lines()[2:]
    assert len(points) == 2, "two distinct intensities: two points"
    # the softmax (1.5 FLOP/byte) sits on the sloped part: intensity × bandwidth, below the fp32 roof
    assert abs(points[0].get_ydata()[0] - 1.5 * 4.3e12 / 1e12) < 1e-9
    assert abs(points[1].get_ydata()[0] - min(800e12, 62.0 * 4.3e12) / 1e12) < 1e-9
    assert len(ax.texts) == 2 and ax.get_xscale() == "log" and "FLOP / byte" in ax.get_xlabel()
    plt.close(fig)
