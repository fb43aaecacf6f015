package cli

import (
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpucr/gpucr/helper/checkpoint"
	"github.com/gpucr/gpucr/helper/client"
	"github.com/gpucr/gpucr/helper/internal/units"

	ucli "github.com/urfave/cli/v2"

	"github.com/gpucr/gpucr/image"
	"github.com/gpucr/gpucr/protocol/imagepb"
)

// imageCommand is `gpucr image`: look at, check, compare and clean up the GPU
// images gpucr writes into CRIU image directories (package image).
func imageCommand() *ucli.Command {
	jsonFlag := &ucli.BoolFlag{Name: "json", Usage: "machine-readable output"}
	usage := func(_ *ucli.Context, err error, _ bool) error { return usageError{err} }
	cmd := &ucli.Command{
		Name:  "image",
		Usage: "inspect, verify, compare and garbage-collect GPU images; keep one's GPU data resident",
		// `gpucr help image` lists the subcommands too, as `gpucr image --help`
		// does (urfave's template for it finds none before the command runs)
		CustomHelpTemplate: imageHelpTemplate,
		Subcommands: []*ucli.Command{
			{
				Name:      "inspect",
				Usage:     "describe an image: origin, parent, buffers and their chunks",
				ArgsUsage: "DIR",
				Flags:     []ucli.Flag{jsonFlag},
				Action:    imageInspect,
			},
			{
				Name:      "verify",
				Usage:     "check every chunk's CRC and hash and every parent reference",
				ArgsUsage: "DIR",
				Flags:     []ucli.Flag{jsonFlag},
				Action:    imageVerify,
			},
			{
				Name:      "diff",
				Usage:     "which buffers were added, removed or changed from image A to image B",
				ArgsUsage: "A B",
				Flags:     []ucli.Flag{jsonFlag},
				Action:    imageDiff,
			},
			{
				Name:      "gc",
				Usage:     "remove the chunks no kept image refers to; a KEEP that holds an unfinished image write (a failed checkpoint's) is removed, unless a process may still wait for its GPU memory in it",
				ArgsUsage: "KEEP...",
				Flags: []ucli.Flag{jsonFlag, socketFlag(),
					&ucli.BoolFlag{Name: "dry-run", Usage: "only print what would be removed"}},
				Action: imageGC,
			},
			{
				Name:      "rm",
				Usage:     "remove images whole (the older checkpoints of a series): each DIR, unless it is being restored, written or read as a parent, or another image of its series still reads chunks from it",
				ArgsUsage: "DIR...",
				Flags: []ucli.Flag{jsonFlag,
					&ucli.BoolFlag{Name: "dry-run", Usage: "only check and print what would be removed"}},
				Action: imageRm,
			},
			imageLoadCommand(jsonFlag),
			imageUnloadCommand(jsonFlag),
			imagePushCommand(jsonFlag),
			imagePullCommand(jsonFlag),
			imageLsCommand(jsonFlag),
			imageReceiveCommand(),
			imageDiscardCommand(),
		},
		// Reached only without a known subcommand.
		Action: func(c *ucli.Context) error {
			_ = ucli.ShowSubcommandHelp(c)
			if c.Args().Present() {
				return usageError{fmt.Errorf("image: unknown subcommand %q", c.Args().First())}
			}
			return usageError{errors.New("image: missing subcommand (inspect, verify, diff, gc, rm, load, unload, push, pull, ls, receive or discard)")}
		},
		OnUsageError: usage,
	}
	for _, s := range cmd.Subcommands {
		s.OnUsageError = usage
		s.HideHelpCommand = true
	}
	return cmd
}

// errHelpShown ends a command after it printed its help because of a -h that
// came after its arguments.
var errHelpShown = errors.New("help shown")

// commandArgs returns the positional arguments of c, checked against min and
// max (max < 0: no limit). urfave/cli, like Go's flag package, stops reading
// flags at the first argument, but the documented form puts them last
// (`gpucr image inspect DIR --json`): flagsAnywhere applies the command's own
// flags found among the arguments. "--" ends the flags, for a directory whose
// name starts with '-'.
func commandArgs(c *ucli.Context, minArgs, maxArgs int) ([]string, error) {
	pos, err := flagsAnywhere(c)
	if err != nil {
		return nil, err
	}
	if len(pos) < minArgs || (maxArgs >= 0 && len(pos) > maxArgs) {
		return nil, usageError{fmt.Errorf("usage: gpucr %s [flags] %s", commandName(c), c.Command.ArgsUsage)}
	}
	return pos, nil
}

func isBoolFlag(cmd *ucli.Command, name string) bool {
	for _, f := range cmd.Flags {
		if _, ok := f.(*ucli.BoolFlag); !ok {
			continue
		}
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

// helpOK turns errHelpShown into success: -h is not a failure.
func helpOK(err error) error {
	if errors.Is(err, errHelpShown) {
		return nil
	}
	return err
}

// openImage opens the image in dir, or says in one line why dir holds none:
// missing, not a directory, no GPU image in it, a write that never committed,
// an unreadable or damaged manifest, a missing parent.
func openImage(dir string) (*image.Image, error) {
	if err := checkImageDir(dir); err != nil {
		return nil, err
	}
	im, err := image.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", dir, describeImageError(err))
	}
	return im, nil
}

// checkImageDir tells the common ways a directory is not an image apart
// before the image package reads it, because they need different advice: a
// typo, a CRIU directory without GPU state, a dump that was interrupted.
func checkImageDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s: no such directory", dir)
	case err != nil:
		return fmt.Errorf("%s: %w", dir, err)
	case !st.IsDir():
		return fmt.Errorf("%s: not a directory", dir)
	}
	sub := filepath.Join(dir, image.SubDir)
	if fi, err := os.Lstat(sub); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		// The image package follows no link in an image; nor is one
		// described as what it points to.
		return fmt.Errorf("%s: %s is a symlink, not a directory (symlinks in an image are not followed)", dir, image.SubDir)
	}
	if _, err := os.Stat(image.ManifestPath(dir)); errors.Is(err, fs.ErrNotExist) {
		// A writer creates DIR/gpucr first and renames the manifest into
		// place last: the directory without a manifest is a write that
		// never committed (or one still going on).
		if _, err := os.Stat(sub); err == nil {
			return fmt.Errorf("%s: unfinished image write: %s/ holds no committed manifest (the writer stopped before committing, or is still writing)",
				dir, image.SubDir)
		}
		return fmt.Errorf("%s: not a gpucr image (no %s/manifest.pb)", dir, image.SubDir)
	}
	return nil
}

// describeImageError says what kind of trouble err is, in front of the image
// package's own message (which names the file, buffer and chunk).
func describeImageError(err error) string {
	var what string
	switch {
	case errors.Is(err, image.ErrIncomplete):
		what = "unfinished image write"
	case errors.Is(err, image.ErrVersion):
		what = "image format not supported by this gpucr"
	case errors.Is(err, image.ErrMissingParent):
		what = "parent image missing"
	case errors.Is(err, image.ErrPruned):
		what = "image pruned by gc"
	case errors.Is(err, image.ErrBusy):
		what = "image directory in use"
	default:
		var me *image.ManifestError
		if errors.As(err, &me) || errors.Is(err, image.ErrCorrupt) {
			what = "damaged image"
		}
	}
	msg := oneLine(err.Error())
	if what == "" || strings.Contains(msg, what) {
		return msg
	}
	return what + ": " + msg
}

// oneLine keeps an error message on one line, so each problem is one line of
// output a script can grep.
func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// ---- inspect ----------------------------------------------------------------

// inspectDoc is `gpucr image inspect --json`. Field names are stable: scripts
// depend on them. Addresses are hex strings, since JSON numbers lose precision
// above 2^53 in most parsers.
type inspectDoc struct {
	Dir           string          `json:"dir"`
	FormatVersion uint32          `json:"format_version"`
	ImageID       string          `json:"image_id"`
	Origin        originDoc       `json:"origin"`
	Parent        string          `json:"parent"`      // as stored (relative to dir); "" for none
	ParentPath    string          `json:"parent_path"` // resolved against dir; "" for none
	Pruned        bool            `json:"pruned"`      // gc removed chunks only descendants needed
	ChunkSize     uint32          `json:"chunk_size"`
	Compression   string          `json:"compression"`
	Buffers       []inspectBuffer `json:"buffers"`
	Totals        inspectTotals   `json:"totals"`
	// Processes: each process of the image and the GPUs it could see (by
	// its ordinal; what a restore onto other GPUs pairs).
	Processes []inspectProcess `json:"processes"`
}

type inspectProcess struct {
	Pid   int64    `json:"pid"`
	NsPid int64    `json:"ns_pid,omitempty"`
	GPUs  []string `json:"gpus"`
	// Served: it ran in served mode (its restore asks nothing of the driver).
	Served bool `json:"served,omitempty"`
	// TemplateBytes: the size of the template script its checkpoint kept
	// (gpucr checkpoint --template); 0: none.
	TemplateBytes uint64 `json:"template_bytes,omitempty"`
}

type originDoc struct {
	Host          string `json:"host"`
	GPUModel      string `json:"gpu_model"`
	GPUUUID       string `json:"gpu_uuid"`
	DriverVersion string `json:"driver_version"`
	Pid           int64  `json:"pid"`
	Time          string `json:"time"` // RFC 3339 UTC; "" if not recorded
}

// chunkCounts classifies a buffer's chunks by where their bytes are.
type chunkCounts struct {
	Total  int `json:"total"`
	Here   int `json:"here"`   // in a chunk file of this image, first reference to it
	Parent int `json:"parent"` // the parent chain's: its file there, or a hard link of it here (stored once for both)
	Zero   int `json:"zero"`   // all zero: no file
	Dedup  int `json:"dedup"`  // same bytes as an earlier chunk of this image: its file
}

func (c *chunkCounts) add(o chunkCounts) {
	c.Total += o.Total
	c.Here += o.Here
	c.Parent += o.Parent
	c.Zero += o.Zero
	c.Dedup += o.Dedup
}

type inspectBuffer struct {
	Index       int         `json:"index"`
	Pid         int64       `json:"pid"`
	Device      int32       `json:"device"`
	GPUUUID     string      `json:"gpu_uuid"`
	Address     string      `json:"address"`
	Size        uint64      `json:"size"`
	Kind        string      `json:"kind"`
	GPUDirect   bool        `json:"gpu_direct_rdma,omitempty"` // created GPUDirect RDMA capable
	Chunks      chunkCounts `json:"chunks"`
	StoredBytes uint64      `json:"stored_bytes"` // file bytes of the chunks counted in Here

	addr uint64 // for sorting
}

type inspectTotals struct {
	Buffers      int         `json:"buffers"`
	LogicalBytes uint64      `json:"logical_bytes"`
	StoredBytes  uint64      `json:"stored_bytes"` // this image's own chunk files
	Chunks       chunkCounts `json:"chunks"`
	// DedupRatio is logical bytes over bytes stored here: what zero elision,
	// dedup, the parent and compression saved together (1: nothing saved,
	// 0: nothing stored here at all).
	DedupRatio float64 `json:"dedup_ratio"`
}

func imageInspect(c *ucli.Context) error {
	args, err := commandArgs(c, 1, 1)
	if err != nil {
		return helpOK(err)
	}
	im, err := openImage(args[0])
	if err != nil {
		return err
	}
	doc := buildInspect(args[0], im.Manifest())
	if c.Bool("json") {
		return writeJSON(c.App.Writer, doc)
	}
	printInspect(c.App.Writer, doc)
	return nil
}

func buildInspect(dir string, m *imagepb.Manifest) inspectDoc {
	o := m.GetOrigin()
	doc := inspectDoc{
		Dir:           dir,
		FormatVersion: m.GetFormatVersion(),
		ImageID:       hex.EncodeToString(m.GetImageId()),
		Origin: originDoc{
			Host:          o.GetHost(),
			GPUModel:      o.GetGpuModel(),
			GPUUUID:       o.GetGpuUuid(),
			DriverVersion: o.GetDriverVersion(),
			Pid:           o.GetPid(),
		},
		Parent:      m.GetParent().GetPath(),
		Pruned:      m.GetPruned(),
		ChunkSize:   m.GetChunkSize(),
		Compression: image.Compression(m.GetCompression()).String(),
		Buffers:     []inspectBuffer{},
		Processes:   []inspectProcess{},
	}
	for _, p := range m.GetProcesses() {
		doc.Processes = append(doc.Processes, inspectProcess{Pid: p.GetPid(), NsPid: p.GetNsPid(), GPUs: append([]string{}, p.GetGpus()...),
			Served: p.GetServed(), TemplateBytes: p.GetTemplate().GetSize()})
	}
	if ns := o.GetTimeUnixNano(); ns != 0 {
		doc.Origin.Time = time.Unix(0, ns).UTC().Format(time.RFC3339)
	}
	if doc.Parent != "" {
		doc.ParentPath = filepath.Clean(filepath.Join(dir, doc.Parent))
	}
	// A file is "here" for the first chunk that refers to it, in manifest
	// order, and "dedup" for every later one: that is how often it is stored
	// versus referenced, whichever order the writer happened to store them in.
	seen := map[string]bool{}
	for i, b := range m.GetBuffers() {
		ib := inspectBuffer{
			Index:     i,
			Pid:       b.GetPid(),
			Device:    b.GetDevice(),
			GPUUUID:   b.GetGpuUuid(),
			Address:   fmt.Sprintf("0x%x", b.GetAddress()),
			Size:      b.GetSize(),
			Kind:      image.AllocKind(b.GetKind()).String(),
			GPUDirect: image.AllocFlags(b.GetAllocFlags())&image.AllocFlagGPUDirectRDMA != 0,
			addr:      b.GetAddress(),
		}
		for _, ch := range b.GetChunks() {
			ib.Chunks.Total++
			switch {
			case ch.GetLinked():
				// A hard link of the parent's file: the parent's bytes,
				// stored once for both.
				ib.Chunks.Parent++
			case ch.GetLocation() == imagepb.Location_LOCATION_LOCAL:
				h := string(ch.GetHash())
				if seen[h] {
					ib.Chunks.Dedup++
					continue
				}
				seen[h] = true
				ib.Chunks.Here++
				ib.StoredBytes += uint64(ch.GetStoredSize())
			case ch.GetLocation() == imagepb.Location_LOCATION_PARENT:
				ib.Chunks.Parent++
			case ch.GetLocation() == imagepb.Location_LOCATION_ZERO:
				ib.Chunks.Zero++
			}
		}
		doc.Buffers = append(doc.Buffers, ib)
		doc.Totals.Buffers++
		doc.Totals.LogicalBytes += ib.Size
		doc.Totals.StoredBytes += ib.StoredBytes
		doc.Totals.Chunks.add(ib.Chunks)
	}
	switch {
	case doc.Totals.StoredBytes > 0:
		doc.Totals.DedupRatio = float64(doc.Totals.LogicalBytes) / float64(doc.Totals.StoredBytes)
	case doc.Totals.LogicalBytes == 0:
		doc.Totals.DedupRatio = 1
	}
	return doc
}

func printInspect(w io.Writer, d inspectDoc) {
	fmt.Fprintf(w, "image:       %s\n", d.Dir)
	fmt.Fprintf(w, "format:      version %d, id %s, chunks of %s, compression %s\n",
		d.FormatVersion, orDash(d.ImageID), humanBytes(uint64(d.ChunkSize)), d.Compression)
	o := d.Origin
	fmt.Fprintf(w, "origin:      host %s, pid %d, time %s\n", orDash(o.Host), o.Pid, orDash(o.Time))
	fmt.Fprintf(w, "gpu:         %s (%s), driver %s\n", orDash(o.GPUModel), orDash(o.GPUUUID), orDash(o.DriverVersion))
	if d.Parent == "" {
		fmt.Fprintf(w, "parent:      none\n")
	} else {
		fmt.Fprintf(w, "parent:      %s (%s)\n", d.Parent, d.ParentPath)
	}
	if d.Pruned {
		fmt.Fprintf(w, "pruned:      yes: gc removed chunks only descendants need; not restorable by itself\n")
	}
	// Grouped by process and device, in address order within each.
	bufs := slices.Clone(d.Buffers)
	slices.SortStableFunc(bufs, func(a, b inspectBuffer) int {
		return cmp.Or(cmp.Compare(a.Pid, b.Pid), cmp.Compare(a.Device, b.Device), cmp.Compare(a.addr, b.addr))
	})
	for i, b := range bufs {
		if i == 0 || b.Pid != bufs[i-1].Pid || b.Device != bufs[i-1].Device {
			fmt.Fprintf(w, "\nprocess %d, device %d (%s)\n", b.Pid, b.Device, orDash(b.GPUUUID))
			fmt.Fprintf(w, "  %-16s %10s  %-8s %6s %6s %6s %6s %6s\n", "ADDRESS", "SIZE", "KIND", "CHUNKS", "HERE", "PARENT", "ZERO", "DEDUP")
		}
		ch := b.Chunks
		fmt.Fprintf(w, "  %-16s %10s  %-8s %6d %6d %6d %6d %6d\n", b.Address, humanBytes(b.Size), b.Kind, ch.Total, ch.Here, ch.Parent, ch.Zero, ch.Dedup)
	}
	for i, p := range d.Processes {
		if i == 0 {
			fmt.Fprintln(w)
		}
		gpus := "not recorded"
		if len(p.GPUs) > 0 {
			gpus = strings.Join(p.GPUs, ", ")
		}
		mode := ""
		if p.Served {
			mode = " (served mode)"
		}
		if p.TemplateBytes > 0 {
			mode = fmt.Sprintf(" (served mode, a template script of %s)", humanBytes(p.TemplateBytes))
		}
		fmt.Fprintf(w, "process %d%s saw the GPUs: %s\n", p.Pid, mode, gpus)
	}
	t := d.Totals
	fmt.Fprintf(w, "\ntotal:       %d buffers, %s, %s stored in this image\n", t.Buffers, humanBytes(t.LogicalBytes), humanBytes(t.StoredBytes))
	fmt.Fprintf(w, "chunks:      %d: %d here, %d in parent, %d zero, %d dedup\n", t.Chunks.Total, t.Chunks.Here, t.Chunks.Parent, t.Chunks.Zero, t.Chunks.Dedup)
	if t.StoredBytes > 0 {
		fmt.Fprintf(w, "dedup ratio: %.2f (bytes / bytes stored here)\n", t.DedupRatio)
	} else {
		fmt.Fprintf(w, "dedup ratio: - (nothing stored here)\n")
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(n uint64) string { return units.Bytes(n) }

// ---- verify -----------------------------------------------------------------

type verifyDoc struct {
	Dir      string          `json:"dir"`
	OK       bool            `json:"ok"`
	Buffers  int             `json:"buffers"`
	Chunks   int             `json:"chunks"`
	Problems []verifyProblem `json:"problems"`
}

// verifyProblem is one thing wrong with an image. Buffer and Chunk are -1
// when the problem is not in a chunk (a manifest or a parent).
type verifyProblem struct {
	Image   string `json:"image,omitempty"` // the image (in the parent chain) holding the chunk
	Buffer  int    `json:"buffer"`
	Address string `json:"address,omitempty"`
	Chunk   int    `json:"chunk"`
	File    string `json:"file,omitempty"`
	Error   string `json:"error"`
}

func (p verifyProblem) String() string {
	var b strings.Builder
	if p.Buffer >= 0 {
		fmt.Fprintf(&b, "buffer %d", p.Buffer)
		if p.Address != "" {
			fmt.Fprintf(&b, " (%s)", p.Address)
		}
		if p.Chunk >= 0 {
			fmt.Fprintf(&b, " chunk %d", p.Chunk)
		}
		b.WriteString(": ")
	}
	if p.File != "" {
		fmt.Fprintf(&b, "file %s: ", p.File)
	}
	b.WriteString(p.Error)
	return b.String()
}

func imageVerify(c *ucli.Context) error {
	args, err := commandArgs(c, 1, 1)
	if err != nil {
		return helpOK(err)
	}
	dir := args[0]
	doc := verifyDoc{Dir: dir, Problems: []verifyProblem{}}
	im, err := openImage(dir)
	if err != nil {
		doc.Problems = append(doc.Problems, verifyProblem{Buffer: -1, Chunk: -1, Error: err.Error()})
	} else {
		for _, b := range im.Manifest().GetBuffers() {
			doc.Buffers++
			doc.Chunks += len(b.GetChunks())
		}
		doc.Problems = append(doc.Problems, verifyProblems(im.CheckRestorable())...)
		doc.Problems = append(doc.Problems, verifyProblems(im.Verify())...)
	}
	doc.OK = len(doc.Problems) == 0
	if c.Bool("json") {
		if err := writeJSON(c.App.Writer, doc); err != nil {
			return err
		}
		if !doc.OK {
			return jsonDone{errors.New(doc.Problems[0].Error)}
		}
		return nil
	}
	if doc.OK {
		fmt.Fprintf(c.App.Writer, "ok: %s: %d buffers, %d chunks, every CRC, hash and parent reference checked\n", dir, doc.Buffers, doc.Chunks)
	} else if im != nil {
		for _, p := range doc.Problems {
			fmt.Fprintf(c.App.Writer, "FAIL %s\n", p)
		}
	}
	switch {
	case doc.OK:
		return nil
	case im == nil:
		return errors.New(doc.Problems[0].Error)
	case len(doc.Problems) == 1:
		return fmt.Errorf("%s: image is damaged: %s", dir, doc.Problems[0])
	default:
		return fmt.Errorf("%s: image is damaged: %d problems, first: %s", dir, len(doc.Problems), doc.Problems[0])
	}
}

// verifyProblems flattens what Verify returned (one error, or several joined)
// into one problem each, with the buffer, chunk and file when it names them.
func verifyProblems(err error) []verifyProblem {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []verifyProblem
		for _, e := range j.Unwrap() {
			out = append(out, verifyProblems(e)...)
		}
		return out
	}
	p := verifyProblem{Buffer: -1, Chunk: -1, Error: oneLine(err.Error())}
	var ce *image.ChunkError
	if errors.As(err, &ce) {
		p = chunkProblem(ce)
	}
	return []verifyProblem{p}
}

// chunkProblem turns the image package's description of a bad chunk into
// a problem line.
func chunkProblem(ce *image.ChunkError) verifyProblem {
	p := verifyProblem{Image: ce.Image, Buffer: ce.Buffer, Chunk: ce.Chunk, File: ce.File, Error: "damaged"}
	if ce.Buffer >= 0 {
		p.Address = fmt.Sprintf("0x%x", ce.Address)
	}
	if ce.Err != nil {
		p.Error = oneLine(ce.Err.Error())
	}
	return p
}

// ---- diff -------------------------------------------------------------------

func imageDiff(c *ucli.Context) error {
	args, err := commandArgs(c, 2, 2)
	if err != nil {
		return helpOK(err)
	}
	a, err := openImage(args[0])
	if err != nil {
		return err
	}
	b, err := openImage(args[1])
	if err != nil {
		return err
	}
	rep, err := image.Diff(a, b)
	if err != nil {
		return fmt.Errorf("diff %s %s: %s", args[0], args[1], describeImageError(err))
	}
	doc := buildDiff(args[0], args[1], b, rep)
	if c.Bool("json") {
		return writeJSON(c.App.Writer, doc)
	}
	printDiff(c.App.Writer, doc)
	return nil
}

// diffDoc is `gpucr image diff --json`: how B differs from A. Buffers are
// matched by process and address, as restore maps them.
type diffDoc struct {
	A            string       `json:"a"`
	B            string       `json:"b"`
	Added        []bufferDoc  `json:"added"`   // only in B
	Removed      []bufferDoc  `json:"removed"` // only in A
	Changed      []diffChange `json:"changed"`
	Unchanged    int          `json:"unchanged"`
	BytesChanged uint64       `json:"bytes_changed"`
}

type bufferDoc struct {
	Pid     int    `json:"pid"`
	Device  int    `json:"device"`
	GPUUUID string `json:"gpu_uuid"`
	Address string `json:"address"`
	Size    uint64 `json:"size"`
	Kind    string `json:"kind"`
}

type diffChange struct {
	bufferDoc                // as in B
	IndexA        int        `json:"index_a"`
	IndexB        int        `json:"index_b"`
	Before        *bufferDoc `json:"before,omitempty"` // as in A, when the description changed
	Chunks        int        `json:"chunks"`           // in B
	ChunksChanged int        `json:"chunks_changed"`
	ChangedChunks []int      `json:"changed_chunks"` // indexes in B
	BytesChanged  uint64     `json:"bytes_changed"`
}

func bufferDocOf(b image.BufferInfo) bufferDoc {
	return bufferDoc{Pid: b.Pid, Device: b.Device, GPUUUID: b.GPUUUID,
		Address: fmt.Sprintf("0x%x", b.Address), Size: b.Size, Kind: b.Kind.String()}
}

func buildDiff(a, b string, imB *image.Image, rep *image.DiffReport) diffDoc {
	doc := diffDoc{A: a, B: b, Added: []bufferDoc{}, Removed: []bufferDoc{}, Changed: []diffChange{},
		Unchanged: rep.Unchanged, BytesChanged: rep.BytesChanged}
	for _, x := range rep.OnlyB {
		doc.Added = append(doc.Added, bufferDocOf(x))
	}
	for _, x := range rep.OnlyA {
		doc.Removed = append(doc.Removed, bufferDocOf(x))
	}
	bufsB := imB.Manifest().GetBuffers()
	for _, d := range rep.Changed {
		ch := diffChange{bufferDoc: bufferDocOf(d.B), IndexA: d.IndexA, IndexB: d.IndexB,
			ChunksChanged: len(d.ChunksChanged), ChangedChunks: append([]int{}, d.ChunksChanged...),
			BytesChanged: d.BytesChanged}
		if d.IndexB >= 0 && d.IndexB < len(bufsB) {
			ch.Chunks = len(bufsB[d.IndexB].GetChunks())
		}
		if d.InfoChanged {
			before := bufferDocOf(d.A)
			ch.Before = &before
		}
		doc.Changed = append(doc.Changed, ch)
	}
	return doc
}

func (b bufferDoc) String() string {
	return fmt.Sprintf("pid %d device %d %s %s %s", b.Pid, b.Device, b.Address, humanBytes(b.Size), b.Kind)
}

func printDiff(w io.Writer, d diffDoc) {
	fmt.Fprintf(w, "a: %s\nb: %s\n", d.A, d.B)
	for _, x := range d.Added {
		fmt.Fprintf(w, "added    %s\n", x)
	}
	for _, x := range d.Removed {
		fmt.Fprintf(w, "removed  %s\n", x)
	}
	for _, x := range d.Changed {
		fmt.Fprintf(w, "changed  %s: %d of %d chunks differ (%s)", x.bufferDoc, x.ChunksChanged, x.Chunks, humanBytes(x.BytesChanged))
		if x.Before != nil {
			fmt.Fprintf(w, "; was %s", x.Before)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "summary: %d added, %d removed, %d changed (%s), %d unchanged\n",
		len(d.Added), len(d.Removed), len(d.Changed), humanBytes(d.BytesChanged), d.Unchanged)
}

// ---- gc ---------------------------------------------------------------------

func imageGC(c *ucli.Context) error {
	args, err := commandArgs(c, 1, -1)
	if err != nil {
		return helpOK(err)
	}
	var keep []string
	var unfinished []unfinishedDoc
	for _, dir := range args {
		if unfinishedWrite(dir) {
			// What a failed checkpoint left: nothing to keep in it, and
			// removed unless a process may still wait for its memory there.
			rep, err := image.RemoveUnfinished(dir, image.RemoveOptions{DryRun: c.Bool("dry-run"), Confined: true},
				checkpoint.MayWait(client.SocketPath(c.String("socket"))))
			if err != nil {
				return fmt.Errorf("gc: %s", oneLine(err.Error()))
			}
			unfinished = append(unfinished, unfinishedDoc{Dir: rep.Dir, Files: rep.Files, BytesFreed: rep.BytesFreed})
			continue
		}
		// GC refuses a keep it cannot read too; this says why in plainer
		// words. A pruned image may still be kept (its descendants need it),
		// so image.Open, which refuses those, is not the test.
		if err := checkImageDir(dir); err != nil {
			return fmt.Errorf("gc: keep %w", err)
		}
		keep = append(keep, dir)
	}
	rep, err := &image.GCReport{DryRun: c.Bool("dry-run")}, error(nil)
	if len(keep) > 0 {
		// Confined: as root, only the images of whoever owns each path
		// named (a user's symlink to another user's image is refused).
		rep, err = image.GCWith(keep, image.GCOptions{DryRun: c.Bool("dry-run"), Confined: true})
	}
	if rep != nil {
		// GC reports what it did even when some removals failed.
		doc := buildGC(rep)
		doc.Unfinished = append(doc.Unfinished, unfinished...)
		for _, u := range unfinished {
			doc.BytesFreed += u.BytesFreed
		}
		if c.Bool("json") {
			if jerr := writeJSON(c.App.Writer, doc); jerr != nil {
				return jerr
			}
			if err != nil {
				return jsonDone{errors.New(describeImageError(err))}
			}
		} else {
			printGC(c.App.Writer, doc)
		}
	}
	if err != nil {
		return errors.New(describeImageError(err))
	}
	return nil
}

// gcDoc is `gpucr image gc --json`.
type gcDoc struct {
	DryRun        bool       `json:"dry_run"`
	Dirs          []gcDirDoc `json:"dirs"` // kept images in keep order, then their ancestors
	ChunksRemoved int        `json:"chunks_removed"`
	BytesFreed    int64      `json:"bytes_freed"`
	Pruned        []string   `json:"pruned"` // ancestors marked not restorable by themselves
	// Unfinished are the unfinished image writes removed (DIR/gpucr of a
	// KEEP that held no committed image, and no process waits for).
	Unfinished []unfinishedDoc `json:"unfinished_removed"`
}

type unfinishedDoc struct {
	Dir        string `json:"dir"` // its gpucr/
	Files      int    `json:"files"`
	BytesFreed int64  `json:"bytes_freed"`
}

// unfinishedWrite says whether dir holds an unfinished image write: gpucr/
// without a committed manifest.
func unfinishedWrite(dir string) bool {
	fi, err := os.Lstat(filepath.Join(dir, image.SubDir))
	if err != nil || !fi.IsDir() {
		return false
	}
	_, err = os.Lstat(image.ManifestPath(dir))
	return errors.Is(err, fs.ErrNotExist)
}

type gcDirDoc struct {
	Dir           string   `json:"dir"`
	Kept          bool     `json:"kept"`
	ChunksKept    int      `json:"chunks_kept"`
	ChunksRemoved int      `json:"chunks_removed"`
	TempRemoved   []string `json:"temp_removed"`
	BytesFreed    int64    `json:"bytes_freed"`
	Pruned        bool     `json:"pruned"`     // by this gc
	WasPruned     bool     `json:"was_pruned"` // before it
}

func buildGC(rep *image.GCReport) gcDoc {
	doc := gcDoc{DryRun: rep.DryRun, Dirs: []gcDirDoc{}, ChunksRemoved: rep.ChunksDeleted,
		BytesFreed: rep.BytesFreed, Pruned: append([]string{}, rep.Pruned...), Unfinished: []unfinishedDoc{}}
	for _, d := range rep.Dirs {
		doc.Dirs = append(doc.Dirs, gcDirDoc{Dir: d.Dir, Kept: d.Kept, ChunksKept: d.ChunksKept,
			ChunksRemoved: d.ChunksDeleted, TempRemoved: append([]string{}, d.TempRemoved...),
			BytesFreed: d.BytesFreed, Pruned: d.Pruned, WasPruned: d.WasPruned})
	}
	return doc
}

func printGC(w io.Writer, d gcDoc) {
	removed := "removed"
	if d.DryRun {
		removed = "would remove"
		fmt.Fprintln(w, "dry run: nothing is changed")
	}
	temps := 0
	for _, dir := range d.Dirs {
		role := "ancestor"
		if dir.Kept {
			role = "kept"
		}
		fmt.Fprintf(w, "%s (%s): %d chunk files kept, %s %d (%s)", dir.Dir, role, dir.ChunksKept, removed, dir.ChunksRemoved, humanBytes(uint64(dir.BytesFreed)))
		if len(dir.TempRemoved) > 0 {
			fmt.Fprintf(w, ", and unfinished writes %s", strings.Join(dir.TempRemoved, " "))
			temps += len(dir.TempRemoved)
		}
		switch {
		case dir.Pruned && d.DryRun:
			fmt.Fprint(w, "; would be marked pruned (only its kept descendants can be restored)")
		case dir.Pruned:
			fmt.Fprint(w, "; marked pruned (only its kept descendants can be restored)")
		case dir.WasPruned:
			fmt.Fprint(w, "; pruned before")
		}
		fmt.Fprintln(w)
	}
	for _, u := range d.Unfinished {
		fmt.Fprintf(w, "%s: unfinished image write (no process waits for it): %s %d files (%s)\n", u.Dir, removed, u.Files,
			humanBytes(uint64(u.BytesFreed)))
	}
	freed := "freed"
	if d.DryRun {
		freed = "would free"
	}
	fmt.Fprintf(w, "total: %s %d chunk files and %d unfinished writes; %s %s (%d bytes)\n",
		removed, d.ChunksRemoved, temps, freed, humanBytes(uint64(d.BytesFreed)), d.BytesFreed)
}

// ---- rm ---------------------------------------------------------------------

// rmDoc is `gpucr image rm --json`.
type rmDoc struct {
	DryRun  bool        `json:"dry_run"`
	Removed []rmDirDoc  `json:"removed"`
	Refused []rmRefusal `json:"refused"`
	Freed   int64       `json:"bytes_freed"`
	Shared  int64       `json:"bytes_shared"` // files other images still link: they stay
}

type rmDirDoc struct {
	Dir         string `json:"dir"`
	Files       int    `json:"files"`
	BytesFreed  int64  `json:"bytes_freed"`
	BytesShared int64  `json:"bytes_shared"`
}

type rmRefusal struct {
	Dir   string `json:"dir"`
	Error string `json:"error"`
}

// imageRm removes images (image.Remove, confined as gc is). An image that
// another one named here still reads chunks from (written before images
// were self-contained) is tried again once that one is gone, so that
// `gpucr image rm base/1 base/2` removes an old series in any order.
func imageRm(c *ucli.Context) error {
	args, err := commandArgs(c, 1, -1)
	if err != nil {
		return helpOK(err)
	}
	opts := image.RemoveOptions{Confined: true, DryRun: c.Bool("dry-run")}
	doc := rmDoc{DryRun: opts.DryRun, Removed: []rmDirDoc{}, Refused: []rmRefusal{}}
	pending := slices.Clone(args)
	for len(pending) > 0 {
		var again []string
		var refused []rmRefusal
		for _, dir := range pending {
			rep, err := image.Remove(dir, opts)
			var de *image.DependentError
			if errors.As(err, &de) && !opts.DryRun && slices.ContainsFunc(pending, func(p string) bool { return samePath(p, de.Dependent) }) {
				again = append(again, dir)
				continue
			}
			if err != nil {
				refused = append(refused, rmRefusal{Dir: dir, Error: oneLine(err.Error())})
				continue
			}
			doc.Removed = append(doc.Removed, rmDirDoc{Dir: dir, Files: rep.Files, BytesFreed: rep.BytesFreed, BytesShared: rep.BytesShared})
			doc.Freed += rep.BytesFreed
			doc.Shared += rep.BytesShared
		}
		doc.Refused = append(doc.Refused, refused...)
		if len(again) == len(pending) { // no progress: they wait on each other
			for _, dir := range again {
				_, err := image.Remove(dir, opts)
				doc.Refused = append(doc.Refused, rmRefusal{Dir: dir, Error: oneLine(fmt.Sprint(err))})
			}
			break
		}
		pending = again
	}
	if c.Bool("json") {
		if err := writeJSON(c.App.Writer, doc); err != nil {
			return err
		}
		if len(doc.Refused) > 0 {
			return jsonDone{errors.New(doc.Refused[0].Error)}
		}
		return nil
	}
	verb := "removed"
	if opts.DryRun {
		verb = "would remove"
	}
	for _, r := range doc.Removed {
		fmt.Fprintf(c.App.Writer, "%s %s: %d files, %s freed", verb, r.Dir, r.Files, humanBytes(uint64(r.BytesFreed)))
		if r.BytesShared > 0 {
			fmt.Fprintf(c.App.Writer, " (%s of chunks other images share stay with them)", humanBytes(uint64(r.BytesShared)))
		}
		fmt.Fprintln(c.App.Writer)
	}
	switch len(doc.Refused) {
	case 0:
		return nil
	case 1:
		return errors.New(doc.Refused[0].Error)
	}
	for _, r := range doc.Refused[1:] {
		fmt.Fprintf(c.App.ErrWriter, "gpucr: %s\n", r.Error)
	}
	return fmt.Errorf("%d images not removed; %s", len(doc.Refused), doc.Refused[0].Error)
}

// samePath says whether a and b name one directory.
func samePath(a, b string) bool {
	ra, err1 := filepath.EvalSymlinks(a)
	rb, err2 := filepath.EvalSymlinks(b)
	if err1 != nil || err2 != nil {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	ra, _ = filepath.Abs(ra)
	rb, _ = filepath.Abs(rb)
	return ra == rb
}

const imageHelpTemplate = `NAME:
   {{.HelpName}} - {{.Usage}}

USAGE:
   {{.HelpName}} COMMAND [command options] ARGS

COMMANDS:{{range .Subcommands}}{{if not .Hidden}}
   {{join .Names ", "}}{{"\t"}}{{.Usage}}{{end}}{{end}}

Run 'gpucr image COMMAND --help' for a command's options.
`
