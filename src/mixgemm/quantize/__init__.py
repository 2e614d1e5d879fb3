"""Ways to choose a weight's codes beyond round to nearest: HQQ (no data, mixgemm.quantize.hqq) and GPTQ (calibration
data, mixgemm.quantize.gptq for one weight, mixgemm.quantize.sequential for a model, layer by layer). Both write
the plain format of mixgemm.formats.weight, so every kernel, save / reload and tensor parallelism take their
weights unchanged."""
