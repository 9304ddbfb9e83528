"""Build bench/data/labelled_answers.jsonl: (response, ground truth, correct?) pairs in public answer formats.

The formats are the ones competition-math answers and model outputs use (MATH / AIME / GSM8K ground
truths; boxed final answers in the styles of Qwen, Minerva and DeepSeek outputs). Every label is set by
hand here: for each ground truth, a list of equivalent written forms (label True) and of different
answers (label False). Ambiguous cases (a rounded decimal for an exact value, 90 degrees vs pi/2,
answer order in lists) are left out.

Run: python bench/data/make_labelled_set.py  (deterministic; rewrites the JSONL next to this file)
"""

from __future__ import annotations

import json
from pathlib import Path

# (category, ground truth, [equivalent forms], [different answers])
ITEMS: list[tuple[str, str, list[str], list[str]]] = [
    # integers (AIME / GSM8K)
    ("integer", "33", ["33", "033", "33.", "33.0", r"\text{33}", "{33}"], ["34", "3", "-33", "330"]),
    ("integer", "204", ["204", r"204 \text{ ways}", "204 ways"], ["240", "20.4"]),
    ("integer", "1000", ["1,000", "1{,}000", r"1\,000", "10^3", "1000"], ["100", "1,001"]),
    ("integer", "120", ["120", r"\$120", r"120 \text{ dollars}", r"\$ 120.00"], ["12", "1200"]),
    ("integer", "12345678", ["12,345,678", "12345678"], ["1234567", "12,345,679"]),
    ("integer", "0", ["0", "0.0", "-0"], ["1", "O"]),
    ("integer", "-2", ["-2", "k=-2", "- 2", "-2.0"], ["2", "-\\frac{1}{2}"]),
    ("integer", "7", [r"\mathbf{7}", r"\textbf{7}", "7", r"\left( 7 \right)"], ["17", "77"]),
    # units, degrees, percent, currency
    ("units", "12", [r"12 \text{ cm}", r"12\text{ cm}^2", "12 cm", r"12 \mbox{ inches}", r"12\ \text{m}"], ["13", "1.2"]),
    ("units", "90", [r"90^\circ", r"90^{\circ}", "90°", r"90 \text{ degrees}"], [r"45^\circ", "180"]),
    ("units", "50", [r"50\%", r"50 \%", "50"], [r"5\%", "25"]),
    ("units", "36", [r"36 \text{ square units}", r"36\text{ units}^2", r"\$36"], ["6", "72"]),
    # assignments
    ("assignment", "5", ["x=5", "x = 5", "5", r"a_1 = 5"], ["x=-5", "x=6", "-5"]),
    ("assignment", "\\frac{2}{3}", [r"p = \frac{2}{3}", r"\frac{2}{3}"], [r"p=\frac{3}{2}"]),
    # fractions
    ("fraction", r"\frac{3}{4}", [r"\dfrac{3}{4}", r"\tfrac{3}{4}", r"\frac34", "3/4", "0.75", r"\frac{6}{8}",
                                   r"\left(\frac{3}{4}\right)"], [r"\frac{4}{3}", r"\frac{3}{5}", "0.7", "34"]),
    ("fraction", r"-\frac{1}{2}", [r"-\dfrac{1}{2}", r"\frac{-1}{2}", "-0.5", "-1/2"], [r"\frac{1}{2}", "-2"]),
    ("fraction", r"\frac{7}{2}", ["3.5", r"\dfrac72", r"\frac{7}{2}"], [r"\frac{2}{7}", "7/3"]),
    ("fraction", r"\frac{1}{3}", [r"\dfrac{1}{3}", "1/3", r"\frac{2}{6}"], ["3", r"\frac{1}{4}"]),
    ("fraction", r"\frac{11}{36}", [r"\dfrac{11}{36}", "11/36"], [r"\frac{11}{63}", r"\frac{1}{36}"]),
    ("fraction", r"\frac{5}{2}", [r"\frac{10}{4}", "2.5", r"\tfrac52"], [r"\frac{2}{5}"]),
    # radicals
    ("radical", r"2\sqrt{3}", [r"\sqrt{12}", r"2 \sqrt 3", r"2\sqrt3", r"2 \cdot \sqrt{3}"],
     [r"3\sqrt{2}", r"\sqrt{6}", r"2\sqrt{2}"]),
    ("radical", r"\frac{\sqrt{2}}{2}", [r"\frac{1}{\sqrt{2}}", r"\dfrac{\sqrt2}{2}", r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"],
     [r"\sqrt{2}", r"\frac{\sqrt{3}}{2}", r"\frac{1}{2}"]),
    ("radical", r"5\sqrt{5}", [r"\sqrt{125}", r"5 \sqrt{5}"], ["25", r"5\sqrt{2}"]),
    ("radical", r"\frac{3\sqrt{3}}{4}", [r"\dfrac{3\sqrt{3}}{4}", r"\frac{3}{4}\sqrt{3}"], [r"\frac{3\sqrt{3}}{2}"]),
    ("radical", r"4\sqrt{2}", [r"\sqrt{32}", r"4\sqrt{2}"], [r"2\sqrt{4}", r"\sqrt{8}"]),
    ("radical", r"\sqrt{7}", [r"\sqrt{7}", r"\sqrt 7", r"7^{1/2}"], ["7", r"\sqrt{17}"]),
    # symbolic
    ("symbolic", r"\frac{\pi}{2}", [r"\dfrac{\pi}{2}", r"\pi/2", r"\frac{1}{2}\pi"], [r"\pi", r"2\pi", r"\frac{\pi}{3}"]),
    ("symbolic", "x^2+2x+1", ["(x+1)^2", "x^2 + 2x + 1", "1+2x+x^2"], ["x^2+1", "(x-1)^2"]),
    ("symbolic", r"6\pi", [r"6 \pi", r"6\cdot\pi", r"\pi \cdot 6"], [r"3\pi", "6"]),
    ("symbolic", "3+4i", ["3 + 4i", "4i+3"], ["3-4i", "4+3i"]),
    ("symbolic", r"\frac{x+1}{2}", [r"\frac{1+x}{2}", r"\frac{x}{2}+\frac{1}{2}"], [r"\frac{x-1}{2}"]),
    # intervals, points
    ("interval", "[0,1)", ["[0, 1)", r"\left[0,1\right)"], ["[0,1]", "(0,1)"]),
    ("interval", r"(-\infty,3]", [r"(-\infty, 3]", r"\left(-\infty,3\right]"], [r"(-\infty,3)", r"[3,\infty)"]),
    ("tuple", "(1,2)", ["(1, 2)", r"\left(1,2\right)"], ["(2,1)", "(1,3)"]),
    ("tuple", r"(3,\frac{\pi}{2})", [r"\left(3, \frac{\pi}{2}\right)", r"(3,\dfrac{\pi}{2})"], [r"(3,\pi)"]),
    # text / multiple choice
    ("text", r"\text{(C)}", ["C", "(C)", r"\text{C}", r"\textbf{(C)}"], ["B", "(D)"]),
    ("text", r"\text{Monday}", ["Monday", r"\text{Monday}", r"\text{monday}"], ["Tuesday", r"\text{Sunday}"]),
]

WRAPPERS = [
    "Let's solve this step by step.\n\nFirst we set up the equation and simplify both sides carefully. "
    "After collecting like terms we obtain the value below.\n\nTherefore, the final answer is $\\boxed{{{a}}}$.",
    "We compute the quantity directly, checking each step.\n\n**Final Answer**\n\\[\n\\boxed{{{a}}}\n\\]",
    "The final answer is $\\boxed{{{a}}}$. I hope it is correct.",
    "Simplifying, we get\n$$\\boxed{{{a}}}$$",
    "So the answer is \\boxed{{{a}}}.",
]

# Extraction cases: (category, response, ground truth, correct?)
EXTRACTION: list[tuple[str, str, str, bool]] = [
    ("multi_box", r"First guess: \boxed{3}. Wait, I made a mistake in step 2; redoing it gives \boxed{4}.", "4", True),
    ("multi_box", r"First guess: \boxed{3}. Wait, I made a mistake in step 2; redoing it gives \boxed{4}.", "3", False),
    ("multi_box", r"Is it \boxed{4}? No, checking again the answer is \fbox{5}.", "5", True),
    ("multi_box", r"Is it \boxed{4}? No, checking again the answer is \fbox{5}.", "4", False),
    ("fbox", r"Thus $\fbox{42}$.", "42", True),
    ("fbox", r"Thus $\fbox{\dfrac{1}{6}}$.", r"\frac{1}{6}", True),
    ("nested", r"The answer: \boxed{\boxed{7}}", "7", True),
    ("nested_braces", r"The set is \boxed{\{1, 2\}}.", r"\{1,2\}", True),
    ("nested_braces", r"So \boxed{\frac{\sqrt{3}}{\sqrt{3}+1}}.", r"\frac{\sqrt{3}}{\sqrt{3}+1}", True),
    ("early_box", r"The answer is \boxed{17}. " + "Let us double-check this by substituting back into the "
     "original equation: both sides agree, the constraint is satisfied, and every case was counted once. " * 4,
     "17", True),
    ("early_box", r"The answer is \boxed{17}. " + "Let us double-check this by substituting back into the "
     "original equation: both sides agree, the constraint is satisfied, and every case was counted once. " * 4,
     "71", False),
    ("truncated", r"Adding the cases we get \boxed{1", "1", False),
    ("truncated", r"Adding the cases we get \boxed{\frac{1}{2}", r"\frac{1}{2}", False),
    ("no_answer", "It could be 42 or 17.", "42", False),
    ("spacing", r"Hence \boxed{ 42 }.", "42", True),
    ("spacing", r"Hence \boxed {42}.", "42", True),
    ("dollar_inside", r"Hence $x = \boxed{12}$ cm.", "12", True),
    ("answer_and_box", "Answer: 13\n" + r"Wait, recount: \boxed{14}", "14", True),
    ("answer_and_box", "Answer: 13\n" + r"Wait, recount: \boxed{14}", "13", False),
]


def build() -> list[dict]:
    """All labelled pairs, deterministically ordered."""
    rows: list[dict] = []
    k = 0
    for cat, gt, good, bad in ITEMS:
        for label, forms in ((True, good), (False, bad)):
            for a in forms:
                resp = WRAPPERS[k % len(WRAPPERS)].format(a=a)
                k += 1
                rows.append({"category": cat, "response": resp, "ground_truth": gt, "correct": label, "answer": a})
    for cat, resp, gt, label in EXTRACTION:
        rows.append({"category": cat, "response": resp, "ground_truth": gt, "correct": label, "answer": None})
    for i, r in enumerate(rows):
        r["id"] = i
    return rows


if __name__ == "__main__":
    out = Path(__file__).with_name("labelled_answers.jsonl")
    rows = build()
    with out.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    n_true = sum(r["correct"] for r in rows)
    print(f"wrote {len(rows)} pairs ({n_true} correct, {len(rows) - n_true} wrong) to {out}")
