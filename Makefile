# gpucr build. Everything lands in $(BUILD); `make clean` removes it.
#
#   make            build everything (Go binary, simulated driver, test apps)
#   make demo       install what is missing, build, run the main job
#   make test       everything CI runs; ends with a pass/fail count
#   make gpu-apps   build the test apps against the real driver (GPU machine)
#   make proto      regenerate protocol/*pb (Go) and protocol/c (C) from protocol/*.proto (commit the result)
#   make fmt-c      format the project's C files (.clang-format)
#   make lint-c     check their format and run cppcheck on them (CI runs it)
#   make fuzz       run every fuzz target for FUZZTIME each (default 10m; CI runs 20s)

BUILD    ?= build
CC       ?= gcc
GO       ?= go
CFLAGS   ?= -O2 -g
WARN     := -Wall -Wextra -Werror
# Fortified builds here too: the GPU machine's compiler fortifies by default,
# and its warnings must show up here first.
CPPFLAGS += -Iinclude -D_GNU_SOURCE -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2
PICFLAGS := -fPIC -fvisibility=hidden

SIM_SRC    := $(wildcard tests/sim/*.c) $(wildcard tests/sim/kernels/*.c)
SIM_HDR    := $(wildcard tests/sim/*.h) tests/sim/blas/sbkern.h include/gpucr/cudadrv.h include/gpucr/procaddr.h include/gpucr/cuerrors.h include/gpucr/modfile.h tests/apps/common/gpuapp.h
SIM_LIB    := $(BUILD)/sim/libcuda.so.1
# The simulated driver's cuBLAS and cuBLASLt (tests/sim/blas), beside it, and
# their conformance test.
BLAS_DIR   := tests/sim/blas
BLAS_SRC   := $(BLAS_DIR)/simblas.c
BLAS_HDR   := $(BLAS_DIR)/simblas.h $(BLAS_DIR)/sbkern.h include/gpucr/cublas.h include/gpucr/cudadrv.h
CUBLAS     := $(BUILD)/sim/libcublas.so.13
CUBLASLT   := $(BUILD)/sim/libcublasLt.so.13
BLASTEST   := $(BUILD)/bin/blastest
APP_COMMON := $(wildcard tests/apps/common/*.c)
APP_HDR    := $(wildcard tests/apps/common/*.h) include/gpucr/cudadrv.h
APP_SRC    := $(wildcard tests/apps/*.c)
APPS       := $(patsubst tests/apps/%.c,$(BUILD)/bin/%,$(APP_SRC))
# Test applications on the CUDA runtime API: linked against served mode's
# runtime library, found beside them through their RUNPATH.
RT_APP_SRC := $(wildcard tests/apps/runtime/*.c)
RT_APPS    := $(patsubst tests/apps/runtime/%.c,$(BUILD)/bin/%,$(RT_APP_SRC))
# Served mode's attack probes: programs that write their worker's ring past gpucr's own libraries.
SV_APP_SRC := $(wildcard tests/apps/served/*.c)
SV_APPS    := $(patsubst tests/apps/served/%.c,$(BUILD)/bin/%,$(SV_APP_SRC))
DRVTEST    := $(BUILD)/bin/drvtest
GPUCR      := $(BUILD)/bin/gpucr
IMAGEBENCH := $(BUILD)/bin/imagebench
# Measuring tools for the GPU machine, static for the same reason as imagebench.
TOOLS      := $(BUILD)/bin/filebench $(BUILD)/bin/fatbinscan
# The C side of the protocol (protocol/c): the generated messages, the framing
# and the round trip; the interposer and the CRIU plugin both link it.
PROTO_C_SRC := protocol/c/helper.pb-c.c protocol/c/wire.c
PROTO_C_HDR := protocol/c/helper.pb-c.h protocol/c/wire.h
# Served mode's worker as a program of its own (helper/served/cworker/main.c): no Go runtime, so no Go heap at
# a random address in a worker; the helper's pool runs it from beside gpucr.
WORKER     := $(BUILD)/bin/gpucr-worker
WORKER_SRC := helper/served/cworker/main.c helper/served/exec.c helper/served/blas.c $(PROTO_C_SRC)
INTERCEPT_SRC := $(wildcard intercept/src/*.c)
INTERCEPT_HDR := $(wildcard intercept/src/*.h) include/gpucr/cudadrv.h $(PROTO_C_HDR)
INTERCEPT     := $(BUILD)/lib/libgpucr.so
INTERCEPT_UNIT := $(BUILD)/bin/intercept-unit
# Served mode's client library: the application's libcuda.so.1 when a worker
# runs its GPU calls (docs/served-mode.md); its own directory, since
# intercept/src's layering tests cover that one.
SERVED_SRC := $(wildcard intercept/served/*.c)
SERVED_HDR := $(wildcard intercept/served/*.h) protocol/c/served.h include/gpucr/cudadrv.h include/gpucr/procaddr.h include/gpucr/cuerrors.h include/gpucr/modfile.h $(PROTO_C_HDR)
SERVED     := $(BUILD)/lib/served/libcuda.so.1
# Served mode's runtime library: the CUDA runtime API made of the driver API,
# in the application's place of NVIDIA's libcudart.so.13 (intercept/runtime/rt.h).
RUNTIME_SRC := $(wildcard intercept/runtime/*.c)
RUNTIME_HDR := $(wildcard intercept/runtime/*.h) include/gpucr/cudart.h include/gpucr/cudadrv.h intercept/runtime/libcudart.map
RUNTIME     := $(BUILD)/lib/served/libcudart.so.13
# Served mode's NVML: not available in a served process (intercept/nvml/nvml.c says why).
SERVED_NVML := $(BUILD)/lib/served/libnvidia-ml.so.1
# Served mode's cuBLAS and cuBLASLt: forward their calls to the worker, which runs NVIDIA's (intercept/blas/common.h).
SERVED_BLAS_COMMON := intercept/blas/common.c
SERVED_BLAS_HDR := intercept/blas/common.h intercept/served/ext.h protocol/c/served.h include/gpucr/cublas.h include/gpucr/cudadrv.h
SERVED_CUBLAS   := $(BUILD)/lib/served/libcublas.so.13
SERVED_CUBLASLT := $(BUILD)/lib/served/libcublasLt.so.13
# C sources in a directory of their own: the Go test beside them (tests/intercept)
# would otherwise make the go tool take the directory for a cgo package.
INTERCEPT_UNIT_SRC := tests/intercept/c/unit.c
GO_SRC     := $(shell find . -name '*.go' -not -path './build/*' -not -path './.*' 2>/dev/null) go.mod go.sum

.PHONY: all sim apps gpucr imagebench tools intercept served clean demo test deps gpu-apps fmt vet proto plugin install uninstall man fmt-c lint-c fuzz

all: gpucr imagebench sim apps $(DRVTEST) $(BLASTEST) intercept served plugin $(WORKER)

sim: $(SIM_LIB) $(CUBLAS) $(CUBLASLT)
apps: $(APPS) $(RT_APPS) $(SV_APPS)
gpucr: $(GPUCR)
imagebench: $(IMAGEBENCH)
tools: $(TOOLS)
intercept: $(INTERCEPT) $(INTERCEPT_UNIT)
served: $(SERVED) $(RUNTIME) $(SERVED_NVML) $(SERVED_CUBLAS) $(SERVED_CUBLASLT)

# The simulated driver stands in for libcuda.so.1 (same soname), so programs
# linked with -lcuda run on it via LD_LIBRARY_PATH=$(BUILD)/sim. No contraction
# of floating-point operations: the BLAS kernels (kernels/blas.c) round where
# their PTX does.
$(SIM_LIB): $(SIM_SRC) $(SIM_HDR) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/sim $(CFLAGS) -ffp-contract=off $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,-soname,libcuda.so.1 -Wl,--no-undefined -o $@ $(SIM_SRC) -lpthread -lrt -lm
	ln -sf libcuda.so.1 $(BUILD)/sim/libcuda.so

# The simulated cuBLAS and cuBLASLt: the driver API only, each function
# exported under the version node of the soname, as NVIDIA's libraries do
# (libcublas.map, libcublasLt.map). The unversioned names are for linking.
$(CUBLAS): $(BLAS_DIR)/cublas.c $(BLAS_SRC) $(BLAS_HDR) $(BLAS_DIR)/libcublas.map $(SIM_LIB) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread -Wl,-soname,libcublas.so.13 \
		-Wl,--version-script=$(BLAS_DIR)/libcublas.map -Wl,--no-undefined -o $@ $(BLAS_DIR)/cublas.c $(BLAS_SRC) \
		-L$(BUILD)/sim -lcuda -lpthread
	ln -sf libcublas.so.13 $(BUILD)/sim/libcublas.so

$(CUBLASLT): $(BLAS_DIR)/cublaslt.c $(BLAS_SRC) $(BLAS_HDR) $(BLAS_DIR)/libcublasLt.map $(SIM_LIB) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread -Wl,-soname,libcublasLt.so.13 \
		-Wl,--version-script=$(BLAS_DIR)/libcublasLt.map -Wl,--no-undefined -o $@ $(BLAS_DIR)/cublaslt.c $(BLAS_SRC) \
		-L$(BUILD)/sim -lcuda -lpthread
	ln -sf libcublasLt.so.13 $(BUILD)/sim/libcublasLt.so

# The LD_PRELOAD interposer. Only the interposed driver entry points and dlsym
# are exported (-fvisibility=hidden, GC_EXPORT); the protobuf-c runtime is
# found next to the library too ($$ORIGIN), for machines that lack it.
$(INTERCEPT): $(INTERCEPT_SRC) $(INTERCEPT_HDR) $(PROTO_C_SRC) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iprotocol/c $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,--no-undefined -Wl,-rpath,'$$ORIGIN' -o $@ $(INTERCEPT_SRC) $(PROTO_C_SRC) \
		-lprotobuf-c -ldl -lpthread

# Served mode's cuBLAS and cuBLASLt: exported under NVIDIA's version nodes (the
# programs that link NVIDIA's libraries ask for their symbols by version).
$(SERVED_CUBLAS): intercept/blas/blas.c $(SERVED_BLAS_COMMON) $(SERVED_BLAS_HDR) intercept/blas/libcublas.map Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iprotocol/c $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,-soname,libcublas.so.13 -Wl,--version-script,intercept/blas/libcublas.map -Wl,--no-undefined -o $@ \
		intercept/blas/blas.c $(SERVED_BLAS_COMMON) -ldl -lpthread
$(SERVED_CUBLASLT): intercept/blas/lt.c $(SERVED_BLAS_COMMON) $(SERVED_BLAS_HDR) intercept/blas/libcublasLt.map Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iprotocol/c $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,-soname,libcublasLt.so.13 -Wl,--version-script,intercept/blas/libcublasLt.map -Wl,--no-undefined -o $@ \
		intercept/blas/lt.c $(SERVED_BLAS_COMMON) -ldl -lpthread

# Served mode's libcuda.so.1: only driver entry points are exported
# (-fvisibility=hidden, SV_API); protobuf-c is found beside it too ($$ORIGIN).
$(SERVED): $(SERVED_SRC) $(SERVED_HDR) $(PROTO_C_SRC) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iprotocol/c $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,-soname,libcuda.so.1 -Wl,--no-undefined -Wl,-rpath,'$$ORIGIN:$$ORIGIN/..' -o $@ \
		$(SERVED_SRC) $(PROTO_C_SRC) -lprotobuf-c -lpthread

# Served mode's runtime library: only the runtime's functions are exported, under
# the version node that programs linked against NVIDIA's runtime ask for. It
# calls the driver that is loaded (served mode's, the simulated or the real one).
$(RUNTIME): $(RUNTIME_SRC) $(RUNTIME_HDR) $(SIM_LIB) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -shared -pthread \
		-Wl,-soname,libcudart.so.13 -Wl,--version-script=intercept/runtime/libcudart.map -Wl,--no-undefined \
		-o $@ $(RUNTIME_SRC) -L$(BUILD)/sim -lcuda -ldl -lpthread

$(SERVED_NVML): intercept/nvml/nvml.c Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(WARN) $(PICFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -Wl,--no-undefined -o $@ $<

# The CRIU plugin. Built against CRIU's public criu-plugin.h only (-isystem:
# its inline dummies have unused parameters); only CR_PLUGIN_DESC is exported.
# criu_get_image_dir comes from the criu binary, so no --no-undefined. It
# shares protocol/c with the interposer, nothing of intercept/.
CRIU_INCLUDE ?= /opt/gpucr/criu/include
$(WORKER): $(WORKER_SRC) helper/served/exec.h helper/served/blas.h protocol/c/served.h include/gpucr/cublas.h include/gpucr/cudadrv.h $(PROTO_C_HDR) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Ihelper/served -Iprotocol/c $(CFLAGS) $(WARN) -o $@ $(WORKER_SRC) -lprotobuf-c -ldl

PLUGIN       := $(BUILD)/lib/criu/gpucr_plugin.so
PLUGIN_SRC   := criuplugin/gpucr_plugin.c $(PROTO_C_SRC)
plugin: $(PLUGIN)

$(PLUGIN): $(PLUGIN_SRC) $(PROTO_C_HDR) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -isystem $(CRIU_INCLUDE) -Iprotocol/c $(CFLAGS) $(WARN) $(PICFLAGS) -shared \
		-Wl,-rpath,'$$ORIGIN:$$ORIGIN/..' -o $@ $(PLUGIN_SRC) -lprotobuf-c

# make install: the plugin where CRIU looks by default (criu --help: "by
# default /usr/lib/criu/"), the gpucr binary and the interposer where gpucr
# run finds it (docs/helper-protocol.md), the helper's systemd unit below
# $(PREFIX) like the binary it starts ($(PREFIX)/lib/systemd/system: systemd
# reads /usr/local/lib/systemd/system for units the administrator installed
# and /usr/lib/systemd/system for the distribution's, and leaves
# /etc/systemd/system to the administrator's own units and drop-ins; with
# another PREFIX set SYSTEMD_UNIT_DIR=/etc/systemd/system), its ExecStart
# and Documentation pointed at $(PREFIX), and the protocol document it names.
# DESTDIR stages everything below a root for packaging (tests/e2e/install_test.go).
PREFIX           ?= /usr/local
CRIU_PLUGIN_DIR  ?= /usr/lib/criu
GPUCR_LIB_DIR    ?= /usr/lib/gpucr
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
DOC_DIR          ?= $(PREFIX)/share/doc/gpucr
MAN_DIR          ?= $(PREFIX)/share/man/man1
BASH_COMP_DIR    ?= $(PREFIX)/share/bash-completion/completions
ZSH_COMP_DIR     ?= $(PREFIX)/share/zsh/site-functions

# man: the manual pages (gpucr.1, gpucr-COMMAND.1) and the shell completion
# scripts, made by gpucr itself from its command definitions.
man: $(GPUCR)
	rm -rf $(BUILD)/man && $(GPUCR) man $(BUILD)/man/man1
	mkdir -p $(BUILD)/man/completion
	$(GPUCR) completion bash > $(BUILD)/man/completion/gpucr
	$(GPUCR) completion zsh > $(BUILD)/man/completion/_gpucr

# The directories install puts files into. Those it has to make (with
# their parents) are recorded in $(INSTALLED_DIRS), beside the interposer, so
# that uninstall removes them again, once empty, and no directory that was
# there before (or that holds another package's files) goes.
INSTALL_DIRS   = $(CRIU_PLUGIN_DIR) $(PREFIX)/bin $(GPUCR_LIB_DIR) $(SYSTEMD_UNIT_DIR) $(DOC_DIR) $(MAN_DIR) \
	$(BASH_COMP_DIR) $(ZSH_COMP_DIR)
INSTALLED_DIRS = $(GPUCR_LIB_DIR)/installed-dirs

# Served mode's libraries (gpucr run --served preloads them from $(GPUCR_LIB_DIR)/served).
SERVED_LIBS := $(SERVED) $(RUNTIME) $(SERVED_NVML) $(SERVED_CUBLAS) $(SERVED_CUBLASLT)

install: $(PLUGIN) $(GPUCR) $(WORKER) $(INTERCEPT) $(SERVED_LIBS) man
	@for d in $(INSTALL_DIRS); do p="$(DESTDIR)$$d"; \
		while [ ! -e "$$p" ]; do echo "$${p#"$(DESTDIR)"}"; p=$$(dirname "$$p"); done; \
	done > $(BUILD)/installed-dirs.new
	install -D -m 0755 $(PLUGIN) $(DESTDIR)$(CRIU_PLUGIN_DIR)/gpucr_plugin.so
	install -D -m 0755 $(GPUCR) $(DESTDIR)$(PREFIX)/bin/gpucr
	install -D -m 0755 $(WORKER) $(DESTDIR)$(PREFIX)/bin/gpucr-worker
	install -D -m 0755 $(INTERCEPT) $(DESTDIR)$(GPUCR_LIB_DIR)/libgpucr.so
	install -d -m 0755 $(DESTDIR)$(GPUCR_LIB_DIR)/served
	install -m 0755 $(SERVED_LIBS) $(DESTDIR)$(GPUCR_LIB_DIR)/served/
	install -d -m 0755 $(DESTDIR)$(SYSTEMD_UNIT_DIR)
	sed -e 's|^ExecStart=/usr/local/bin/gpucr |ExecStart=$(PREFIX)/bin/gpucr |' \
		-e 's|^Documentation=file:///usr/local/share/doc/gpucr/|Documentation=file://$(DOC_DIR)/|' \
		scripts/gpucr-helper.service > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-helper.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-helper.service
	sed -e 's|^\(Exec[A-Za-z]*\)=/usr/local/bin/gpucr |\1=$(PREFIX)/bin/gpucr |' \
		scripts/gpucr-job@.service > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-job@.service
	chmod 0644 $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-job@.service
	install -D -m 0644 docs/helper-protocol.md $(DESTDIR)$(DOC_DIR)/helper-protocol.md
	install -d -m 0755 $(DESTDIR)$(MAN_DIR)
	install -m 0644 $(BUILD)/man/man1/*.1 $(DESTDIR)$(MAN_DIR)/
	install -D -m 0644 $(BUILD)/man/completion/gpucr $(DESTDIR)$(BASH_COMP_DIR)/gpucr
	install -D -m 0644 $(BUILD)/man/completion/_gpucr $(DESTDIR)$(ZSH_COMP_DIR)/_gpucr
	@# an earlier install's record stays: those directories are gpucr's too
	cat $(BUILD)/installed-dirs.new $(wildcard $(DESTDIR)$(INSTALLED_DIRS)) | sort -u > $(BUILD)/installed-dirs
	install -m 0644 $(BUILD)/installed-dirs $(DESTDIR)$(INSTALLED_DIRS)
	@rm -f $(BUILD)/installed-dirs.new $(BUILD)/installed-dirs

# Removes what install put there (the same variables name the same places),
# then the directories install made, deepest first, each only if it is
# empty (rmdir); gpucr's own directories also where no record says so (an
# install before the record).
uninstall:
	@dirs=$$(cat $(DESTDIR)$(INSTALLED_DIRS) 2>/dev/null); \
	rm -f $(DESTDIR)$(INSTALLED_DIRS) $(DESTDIR)$(CRIU_PLUGIN_DIR)/gpucr_plugin.so $(DESTDIR)$(PREFIX)/bin/gpucr \
		$(DESTDIR)$(PREFIX)/bin/gpucr-worker \
		$(DESTDIR)$(GPUCR_LIB_DIR)/libgpucr.so $(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-helper.service \
		'$(DESTDIR)$(SYSTEMD_UNIT_DIR)/gpucr-job@.service' \
		$(addprefix $(DESTDIR)$(GPUCR_LIB_DIR)/served/,$(notdir $(SERVED_LIBS))) \
		$(DESTDIR)$(DOC_DIR)/helper-protocol.md $(DESTDIR)$(MAN_DIR)/gpucr.1 $(DESTDIR)$(MAN_DIR)/gpucr-*.1 \
		$(DESTDIR)$(BASH_COMP_DIR)/gpucr $(DESTDIR)$(ZSH_COMP_DIR)/_gpucr; \
	for d in $$(printf '%s\n' $$dirs $(GPUCR_LIB_DIR)/served $(GPUCR_LIB_DIR) $(DOC_DIR) | sort -r -u); do \
		rmdir "$(DESTDIR)$$d" 2>/dev/null || true; \
	done

# Unit tests of the interposer's driver-free parts (buffer table, slabs, scanning).
INTERCEPT_UNIT_LIB := intercept/src/1_table.c intercept/src/1_scan.c intercept/src/1_stats.c intercept/src/1_gate.c intercept/src/1_log.c \
	intercept/src/1_guard.c intercept/src/1_writes.c intercept/src/1_sync.c
$(INTERCEPT_UNIT): $(INTERCEPT_UNIT_SRC) $(INTERCEPT_UNIT_LIB) $(INTERCEPT_HDR) Makefile
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iintercept/src $(CFLAGS) $(WARN) -pthread -o $@ $(INTERCEPT_UNIT_SRC) $(INTERCEPT_UNIT_LIB)

# Test applications: driver API only, linked against whichever libcuda the
# link path offers (the simulated one here, the real one with gpu-apps).
CUDA_LINK ?= -L$(BUILD)/sim
$(BUILD)/bin/%: tests/apps/%.c $(APP_COMMON) $(APP_HDR) $(SIM_LIB)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/apps/common $(CFLAGS) $(WARN) -pthread -o $@ $< $(APP_COMMON) $(CUDA_LINK) -lcuda

$(SV_APPS): $(BUILD)/bin/%: tests/apps/served/%.c intercept/served/ext.h protocol/c/served.h include/gpucr/cublas.h $(SIM_LIB)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Iprotocol/c -Iintercept/served $(CFLAGS) $(WARN) -pthread -o $@ $< -L$(BUILD)/sim -lcuda -ldl

$(RT_APPS): $(BUILD)/bin/%: tests/apps/runtime/%.c $(APP_COMMON) $(APP_HDR) include/gpucr/cudart.h $(SIM_LIB) $(RUNTIME)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/apps/common $(CFLAGS) $(WARN) -pthread -o $@ $< $(APP_COMMON) $(CUDA_LINK) -lcuda \
		-L$(BUILD)/lib/served -l:libcudart.so.13 -Wl,-rpath-link,$(BUILD)/sim -Wl,-rpath,'$$ORIGIN/../lib/served'

$(DRVTEST): $(wildcard tests/drvtest/*.c tests/drvtest/*.h) $(APP_COMMON) $(APP_HDR) $(SIM_LIB)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/apps/common $(CFLAGS) $(WARN) -pthread -o $@ $(wildcard tests/drvtest/*.c) $(APP_COMMON) $(CUDA_LINK) -lcuda

# Programs on cuBLAS: the simulated one here (found at run time through
# LD_LIBRARY_PATH=$(BUILD)/sim, as the driver is); with gpu-apps NVIDIA's, from
# CUBLAS_LIB_DIR (the pip wheel's directory, which has only the versioned
# names), found there through the RUNPATH.
BLAS_DEPS ?= $(CUBLAS) $(CUBLASLT)
BLAS_LINK ?= -L$(BUILD)/sim -Wl,-rpath-link,$(BUILD)/sim
BLAS_LIBS := -l:libcublas.so.13 -l:libcublasLt.so.13
# blastest computes its references without contraction, as the kernels are defined.
$(BLASTEST): $(BLAS_DIR)/blastest.c include/gpucr/cublas.h include/gpucr/cudadrv.h $(SIM_LIB) $(BLAS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) $(CFLAGS) -ffp-contract=off $(WARN) -pthread -o $@ $< $(BLAS_LINK) $(BLAS_LIBS) $(CUDA_LINK) -lcuda -lm

$(BUILD)/bin/blasbeat $(BUILD)/bin/blasbench: $(BUILD)/bin/%: tests/apps/%.c $(APP_COMMON) $(APP_HDR) include/gpucr/cublas.h $(SIM_LIB) $(BLAS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(CPPFLAGS) -Itests/apps/common $(CFLAGS) $(WARN) -pthread -o $@ $< $(APP_COMMON) $(BLAS_LINK) $(BLAS_LIBS) \
		$(CUDA_LINK) -lcuda

# On the GPU machine: the same sources against the real driver, and the
# programs on cuBLAS against NVIDIA's from CUBLAS_LIB_DIR (by default the
# directory of the nvidia-cublas wheel that python3 finds; without one they
# are left out, saying so).
CUBLAS_LIB_DIR ?= $(shell python3 -c 'import glob, os, nvidia; print(os.path.dirname(sorted(glob.glob(os.path.join(nvidia.__path__[0], "*", "lib", "libcublas.so.*")))[-1]))' 2>/dev/null)
GPU_BLAS_APPS   = $(BUILD)/gpu/bin/blasbeat $(BUILD)/gpu/bin/blasbench $(BUILD)/gpu/bin/blastest
gpu-apps:
	$(if $(CUBLAS_LIB_DIR),,@echo "gpu-apps: no cuBLAS found (set CUBLAS_LIB_DIR): blasbeat and blastest not built")
	$(MAKE) BUILD=$(BUILD)/gpu SIM_LIB= BLAS_DEPS= CUDA_LINK="-L/usr/local/cuda/lib64/stubs -L/usr/lib/x86_64-linux-gnu" \
		BLAS_LINK="-L$(CUBLAS_LIB_DIR) -Wl,-rpath,$(CUBLAS_LIB_DIR)" \
		$(filter-out $(GPU_BLAS_APPS),$(patsubst tests/apps/%.c,$(BUILD)/gpu/bin/%,$(APP_SRC))) $(BUILD)/gpu/bin/drvtest \
		$(if $(CUBLAS_LIB_DIR),$(GPU_BLAS_APPS))

# cgo: the helper dlopen()s the driver (helper/cuda) and NVML (go-nvml), so
# gpucr is linked dynamically against glibc. go-nvml's header declares many
# deprecated functions; their warnings are noise here.
HELPER_C_SRC := $(wildcard helper/cuda/*.c helper/cuda/*.h helper/served/*.c helper/served/*.h) include/gpucr/cudadrv.h \
	protocol/c/served.h
$(GPUCR): $(GO_SRC) $(HELPER_C_SRC)
	@mkdir -p $(@D)
	CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" $(GO) build -trimpath -o $@ ./helper/cmd/gpucr

# Static: scripts/bench-image.sh runs it on the GPU machine, which has no Go
# toolchain.
$(IMAGEBENCH): $(GO_SRC)
	@mkdir -p $(@D)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./image/cmd/imagebench

$(BUILD)/bin/filebench: $(GO_SRC)
	@mkdir -p $(@D)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./image/cmd/filebench

$(BUILD)/bin/fatbinscan: $(GO_SRC)
	@mkdir -p $(@D)
	CGO_ENABLED=0 $(GO) build -trimpath -o $@ ./ptx/cmd/fatbinscan

deps:
	bash scripts/install-deps.sh

# Generated Go code is committed; protocol/gen_test.go fails when it is stale.
# The plugin is the module's tool dependency (go.mod pins its version, which
# must match google.golang.org/protobuf); `go tool -n` builds it and prints its path.
PROTOS   := protocol/image.proto protocol/helper.proto
C_PROTOS := protocol/helper.proto
proto:
	protoc -I . --plugin=protoc-gen-go=$$($(GO) tool -n protoc-gen-go) \
		--go_out=. --go_opt=module=github.com/gpucr/gpucr $(PROTOS)
	protoc-c -I protocol --c_out=protocol/c $(C_PROTOS)

demo: deps all
	bash scripts/demo.sh

test: deps all
	bash scripts/run-tests.sh

FUZZTIME ?= 10m
fuzz: all
	bash scripts/fuzz.sh $(FUZZTIME)

fmt:
	gofmt -l -w $$(find . -name '*.go' -not -path './build/*')

vet:
	$(GO) vet ./...

# The project's C files: everything but the code protoc-c generates.
CLANG_FORMAT ?= clang-format
CPPCHECK     ?= cppcheck
C_FILES := $(shell find . \( -path ./build -o -path './.*' \) -prune -o \( -name '*.c' -o -name '*.h' \) \
	! -name '*.pb-c.*' -print 2>/dev/null | sed 's|^\./||' | sort)
# cppcheck: errors, warnings, performance and portability (its style checks
# are mostly noise here), in the configuration the build compiles, with every
# directory that holds a header on the include path. It reads no system
# header, so the version check of protobuf-c's header is given the version
# it needs. Findings that are no bugs are suppressed where they are
# (`cppcheck-suppress` comments, each with its reason).
CPPCHECK_FLAGS = --quiet --error-exitcode=1 --std=c11 --enable=warning,performance,portability \
	--inline-suppr \
	--template='{file}:{line}: {severity} ({id}): {message}' \
	$(CPPFLAGS) -DPROTOBUF_C_VERSION_NUMBER=1004001 -DPROTOBUF_C_MIN_COMPILER_VERSION=1000000 \
	-DPROTOBUF_C__BEGIN_DECLS= -DPROTOBUF_C__END_DECLS= \
	$(addprefix -I,$(sort $(patsubst %/,%,$(dir $(filter %.h,$(C_FILES))))) protocol/c) -I$(CRIU_INCLUDE)

fmt-c:
	$(CLANG_FORMAT) -i $(C_FILES)

lint-c:
	@echo "$(CLANG_FORMAT) --dry-run -Werror: $(words $(C_FILES)) files"
	@$(CLANG_FORMAT) --dry-run -Werror $(C_FILES)
	@echo "$(CPPCHECK): $(words $(filter %.c,$(C_FILES))) files"
	@$(CPPCHECK) $(CPPCHECK_FLAGS) $(filter %.c,$(C_FILES))

clean:
	rm -rf $(BUILD)
