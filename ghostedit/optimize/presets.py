"""Named configurations, written once: the fastest measured (BEST) and the fastest with exact attention (EXACT).
The bench, the scripts and the docs name them ("best", "exact"); OptimizationConfig.parse reads them."""
EXACT = "fp8=torchao,compile=regional,rewrites=real-rope+joint-layout+inductor-multi-kernel"
BEST = EXACT + ",attention=cudnn-fp8"
PRESETS = {"best": BEST, "exact": EXACT}
