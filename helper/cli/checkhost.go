package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/image/mountinfo"
	"github.com/gpucr/gpucr/protocol/helperpb"
)

// The items of `gpucr check` (check.go), one function each.

func checkKernel(r *checkReport) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		r.add("kernel", checkWarn, fmt.Sprintf("uname: %v", err), nil)
		return
	}
	rel := unix.ByteSliceToString(u.Release[:])
	r.add("kernel", checkOK, "Linux "+rel, map[string]any{"release": rel})
}

// minCRIU is the oldest CRIU gpucr accepts: 4.2. CRIU 4.0 has the device
// plugin hooks, but 4.1.1 hangs in every dump on Linux 6.18.
var minCRIU = [3]int{4, 2, 0}

var criuVersionLine = regexp.MustCompile(`(?m)^Version: +(\d+)\.(\d+)(?:\.(\d+))?`)

// parseCRIUVersion reads `criu --version`'s "Version: 4.2.1".
func parseCRIUVersion(out string) ([3]int, bool) {
	m := criuVersionLine.FindStringSubmatch(out)
	if m == nil {
		return [3]int{}, false
	}
	var v [3]int
	for i := range 3 {
		v[i], _ = strconv.Atoi(m[i+1]) // "" (no sublevel) is 0
	}
	return v, true
}

func versionLess(a, b [3]int) bool {
	for i := range 3 {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

func formatVersion(v [3]int) string { return fmt.Sprintf("%d.%d.%d", v[0], v[1], v[2]) }

// checkCRIUVersion runs `criu --version` under the time limit and says
// whether this CRIU is new enough to try.
func checkCRIUVersion(r *checkReport, criu string, limit time.Duration) bool {
	path, err := exec.LookPath(criu)
	if err != nil {
		r.add("criu", checkFail, fmt.Sprintf("%s not found: %v (scripts/install-criu.sh installs CRIU 4.2)", criu, err), nil)
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "--no-default-config", "--version")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second // a child of a launcher script may hold the pipe
	err = cmd.Run()
	info := map[string]any{"path": path}
	switch {
	case ctx.Err() != nil:
		r.add("criu", checkFail, fmt.Sprintf("%s --version did not answer within %v", path, limit), info)
		return false
	case err != nil:
		r.add("criu", checkFail, fmt.Sprintf("%s --version: %v: %s", path, err, strings.TrimSpace(out.String())), info)
		return false
	}
	v, ok := parseCRIUVersion(out.String())
	if !ok {
		r.add("criu", checkFail, fmt.Sprintf("%s --version says no version: %q", path, strings.TrimSpace(out.String())), info)
		return false
	}
	info["version"] = formatVersion(v)
	if versionLess(v, minCRIU) {
		r.add("criu", checkFail, fmt.Sprintf("CRIU %s (%s) is too old: gpucr needs %s or newer (4.1.1 hangs in every dump on Linux 6.18; scripts/install-criu.sh)",
			formatVersion(v), path, formatVersion(minCRIU)), info)
		return false
	}
	r.add("criu", checkOK, fmt.Sprintf("CRIU %s (%s)", formatVersion(v), path), info)
	return true
}

// criuFeatures are CRIU's kernel features that make checkpoints cheaper:
// neither is needed, so their absence warns.
var criuFeatures = []struct{ feature, item, gives string }{
	{"mem_dirty_track", "criu memory tracking", "pre-dumps that copy only the memory written since the last one (criu pre-dump --track-mem)"},
	{"uffd-noncoop", "criu lazy pages", "restores that run the process before all its memory is in (gpucr restore --lazy-pages)"},
}

// checkCRIUFeatures asks CRIU (`criu check --feature F`) for each of
// criuFeatures.
func checkCRIUFeatures(r *checkReport, criu string, limit time.Duration) {
	for _, f := range criuFeatures {
		ctx, cancel := context.WithTimeout(context.Background(), limit)
		cmd := exec.CommandContext(ctx, criu, "--no-default-config", "check", "--feature", f.feature)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.WaitDelay = time.Second
		err := cmd.Run()
		cancel()
		info := map[string]any{"feature": f.feature}
		if err == nil {
			r.add(f.item, checkOK, fmt.Sprintf("this kernel allows %s", f.gives), info)
			if f.feature == "uffd-noncoop" {
				checkLazyFaults(r)
			}
			continue
		}
		why := strings.TrimSpace(out.String())
		if i := strings.LastIndex(why, "): "); i >= 0 {
			why = why[i+3:] // CRIU's "Warn  (criu/cr-check.c:824): " prefix
		}
		if why == "" {
			why = err.Error()
		}
		r.add(f.item, checkWarn, fmt.Sprintf("CRIU says no (%s): no %s", why, f.gives), info)
	}
}

// checkLazyFaults reports what a page fault served through userfaultfd
// costs here: above the limit, lazy restores of GPU processes are refused
// (NVIDIA's restore of the driver state would wait for its pages).
func checkLazyFaults(r *checkReport) {
	const item = "lazy pages for GPU processes"
	cost, limit, err := checkpoint.LazyFaultCost()
	if err != nil {
		r.add(item, checkWarn, fmt.Sprintf("userfaultfd's round trip could not be measured (%v): gpucr restore --lazy-pages of GPU processes is refused", err), nil)
		return
	}
	us := float64(cost) / float64(time.Microsecond)
	info := map[string]any{"fault_us": us, "limit_us": float64(limit) / float64(time.Microsecond)}
	if cost > limit {
		r.add(item, checkWarn, fmt.Sprintf("a page fault served through userfaultfd takes %.1f us (over %.0f us, GPUCR_LAZY_FAULT_LIMIT_US): "+
			"gpucr restore --lazy-pages of GPU processes is refused (NVIDIA's restore of the driver state would wait for its pages)",
			us, float64(limit)/float64(time.Microsecond)), info)
		return
	}
	r.add(item, checkOK, fmt.Sprintf("a page fault served through userfaultfd takes %.1f us (at most %.0f us for lazy restores of GPU processes)",
		us, float64(limit)/float64(time.Microsecond)), info)
}

// checkCRIUWithPlugin dumps and restores a test process with gpucr's plugin
// loaded the way `gpucr checkpoint` loads it, and reports the self-test and
// the plugin: found, and loaded by CRIU.
func checkCRIUWithPlugin(r *checkReport, o checkOptions, criuOK bool, plugin pluginSearch, perr error) {
	pluginInfo := map[string]any{"searched": plugin.Tried}
	if plugin.Dir != "" {
		pluginInfo["path"] = filepath.Join(plugin.Dir, pluginFile)
	}
	if !criuOK {
		r.add("criu self-test", checkFail, "not run: CRIU above is unusable", nil)
		switch {
		case perr != nil:
			r.add("plugin", checkFail, perr.Error(), pluginInfo)
		case plugin.Dir == "":
			r.add("plugin", checkFail, plugin.notFound(), pluginInfo)
		default:
			r.add("plugin", checkWarn, fmt.Sprintf("found at %s; not tried: CRIU above is unusable", pluginInfo["path"]), pluginInfo)
		}
		return
	}
	if perr != nil { // a wrong --plugin-dir or GPUCR_PLUGIN_DIR: test CRIU alone
		plugin.Dir = ""
	}
	env, err := criuEnvironment(o.socket)
	if err != nil {
		r.add("criu self-test", checkFail, err.Error(), nil)
		return
	}
	res := checkpoint.SelfTest(checkpoint.CRIU{Binary: o.criu, PluginDir: plugin.Dir, Timeout: o.timeout}, env)
	if res.Err != nil {
		r.add("criu self-test", checkFail, res.Err.Error(), nil)
	} else {
		r.add("criu self-test", checkOK, fmt.Sprintf("dumped a test process in %.3f s, restored it in %.3f s, and it ran on",
			res.Dump.Seconds(), res.Restore.Seconds()), map[string]any{"dump_seconds": res.Dump.Seconds(), "restore_seconds": res.Restore.Seconds()})
	}
	switch {
	case perr != nil:
		r.add("plugin", checkFail, perr.Error(), pluginInfo)
	case plugin.Dir == "":
		r.add("plugin", checkFail, plugin.notFound(), pluginInfo)
	case res.PluginLoaded:
		pluginInfo["loaded"] = true
		r.add("plugin", checkOK, fmt.Sprintf("%s, loaded by CRIU", pluginInfo["path"]), pluginInfo)
	case !res.DumpRan:
		r.add("plugin", checkWarn, fmt.Sprintf("found at %s; CRIU's dump did not run to show whether it loads", pluginInfo["path"]), pluginInfo)
	default:
		why := "its dump log does not show the plugin loaded"
		if len(res.DumpErrors) > 0 {
			why += ": " + strings.Join(res.DumpErrors, "; ")
		}
		r.add("plugin", checkFail, fmt.Sprintf("found at %s, but CRIU did not load it (%s)", pluginInfo["path"], why), pluginInfo)
	}
}

func checkInterposer(r *checkReport) {
	p, err := findInterposer()
	if err != nil {
		r.add("interposer", checkFail, err.Error(), nil)
		return
	}
	r.add("interposer", checkOK, p+" (what `gpucr run` preloads)", map[string]any{"path": p})
}

// checkHelper asks the helper for its Status and reports it and its
// driver: the driver the helper loaded, in its environment. It returns the
// Status (nil without a helper).
func checkHelper(r *checkReport, socket string) *helperpb.StatusReply {
	st, err := client.StatusOf(socket, client.StatusTimeout)
	if err != nil {
		r.add("helper", checkFail, fmt.Sprintf("%v (start it: `gpucr helper`, or systemctl start gpucr-helper)", err), map[string]any{"socket": socket})
		r.add("driver", checkFail, "not known: no helper to ask", nil)
		return nil
	}
	r.add("helper", checkOK, fmt.Sprintf("gpucr helper %s on %s", st.HelperVersion, socket),
		map[string]any{"socket": socket, "version": st.HelperVersion})
	r.add(driverItem(st))
	return st
}

// driverItem judges the driver as the helper reports it.
func driverItem(st *helperpb.StatusReply) (string, string, string, map[string]any) {
	d := st.Driver
	if d == nil {
		if st.Unavailable != "" {
			return "driver", checkFail, "the helper has no GPU: " + st.Unavailable, nil
		}
		return "driver", checkWarn, "the helper does not tell its driver (an older helper)", nil
	}
	info := map[string]any{"library": d.Library, "path": d.Path, "version": d.Version, "checkpoint_api": d.CheckpointApi}
	lib := d.Path
	if lib == "" {
		lib = d.Library
	}
	simulated := false
	for _, dev := range st.Devices {
		simulated = simulated || strings.Contains(dev.Name, simDriverMarker)
	}
	info["simulated"] = simulated
	info["devices"] = len(st.Devices)
	switch {
	case d.Error != "":
		return "driver", checkFail, "the helper cannot open its driver: " + d.Error, info
	case !d.CheckpointApi:
		return "driver", checkFail, fmt.Sprintf("%s lacks the driver checkpoint API (%s): gpucr needs R550 or newer",
			lib, strings.Join(d.CheckpointApiMissing, ", ")), info
	case st.Unavailable != "":
		return "driver", checkFail, fmt.Sprintf("%s (CUDA %s): the helper has no GPU: %s", lib, cudaVersion(d.Version), st.Unavailable), info
	}
	for _, dev := range st.Devices {
		if dev.KernelsError != "" {
			info["kernels_error"] = dev.KernelsError
			return "driver", checkFail, fmt.Sprintf("%s (CUDA %s): the helper cannot load gpucr's GPU kernels on GPU %d (%s): %s; "+
				"checkpoints and restores of its memory fail", lib, cudaVersion(d.Version), dev.Ordinal, dev.Uuid, dev.KernelsError), info
		}
	}
	reason := fmt.Sprintf("%s, CUDA %s, checkpoint API present, %d GPU(s), as the helper loaded it", lib, cudaVersion(d.Version), len(st.Devices))
	if simulated {
		reason += " (the simulated driver: no GPU)"
	}
	return "driver", checkOK, reason, info
}

// cudaVersion formats cuDriverGetVersion's 13000 as "13.0".
func cudaVersion(v int32) string {
	if v <= 0 {
		return "version unknown"
	}
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// simDriverMarker is in the names of the simulated driver's devices
// (tests/sim).
const simDriverMarker = "gpucr simulated GPU"

// tmpfsMagic is statfs's f_type of a tmpfs.
const tmpfsMagic = 0x01021994

// checkImagesDir looks at the file system an image directory is (or would
// be) on: a tmpfs without huge pages takes GPU data at about half of PCIe
// speed (README: where images go), and free space against the GPU memory
// the helper's clients hold.
func checkImagesDir(r *checkReport, dir string, st *helperpb.StatusReply) {
	at, err := existingAncestor(dir)
	if err != nil {
		r.add("image dir", checkFail, err.Error(), nil)
		return
	}
	where := dir
	if at != dir {
		where = fmt.Sprintf("%s (not there yet; its parent %s)", dir, at)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(at, &sfs); err != nil {
		r.add("image dir", checkFail, fmt.Sprintf("statfs %s: %v", at, err), nil)
		return
	}
	free := sfs.Bavail * uint64(sfs.Bsize)
	mnt, _ := mountinfo.Of(at) // unknown: no type, no options
	info := map[string]any{"path": dir, "free_bytes": free, "fs_type": mnt.FSType, "mount_point": mnt.Point}
	status, notes := checkOK, []string{}
	if int64(sfs.Type) == tmpfsMagic {
		huge := mnt.Option("huge")
		info["huge"] = huge
		if huge != "always" && huge != "within_size" {
			status = checkWarn
			notes = append(notes, "a tmpfs without huge pages takes GPU data at about half of PCIe speed (mount it with huge=always)")
		} else {
			notes = append(notes, "a tmpfs with huge="+huge)
		}
	}
	var gpu uint64
	if st != nil {
		for _, cl := range st.Clients {
			gpu += cl.Bytes
		}
	}
	switch {
	case free == 0:
		status = checkFail
		notes = append(notes, "its file system is full")
	case gpu > free:
		status = checkWarn
		notes = append(notes, fmt.Sprintf("less free space than the %s of GPU memory the helper's clients hold", humanBytes(gpu)))
	}
	if unix.Access(at, unix.W_OK) != nil {
		status = checkFail
		notes = append(notes, "not writable")
	}
	reason := fmt.Sprintf("%s: %s, %s free", where, mnt.FSType, humanBytes(free))
	if len(notes) > 0 {
		reason += "; " + strings.Join(notes, "; ")
	}
	r.add("image dir", status, reason, info)
}

// existingAncestor is dir, or its nearest ancestor that exists.
func existingAncestor(dir string) (string, error) {
	for d := dir; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err == nil {
			if !fi.IsDir() {
				return "", fmt.Errorf("%s is not a directory", d)
			}
			return d, nil
		}
		if !errors.Is(err, os.ErrNotExist) || d == filepath.Dir(d) {
			return "", err
		}
	}
}
