# A model image: only the tokenizer/model directory, at /model, plus busybox's `cp`.
# The Kubernetes Deployment's init container copies /model into the pod's `model` volume
# (see deploy/kubernetes/deployment.yaml), so the worker image and the model ship and roll out
# independently. Build from the repository root:
#
#   docker build -f deploy/docker/model.Dockerfile --build-arg MODEL_DIR=worker/demo_samples/models/qwen3 \
#       -t derender-model:qwen3 .

FROM busybox:1.37
ARG MODEL_DIR=deploy/docker/model-placeholder
COPY ${MODEL_DIR}/ /model/
USER 10001:10001
CMD ["cp", "-Rf", "/model/.", "/models/model/"]
