#!/usr/bin/env bash
# Makes .kit/ (git-ignored): every library sana-train builds against except LibTorch, CUDA
# and NCCL, as one CMake prefix (.kit/usr), from Debian 12's packages, for a GPU machine
# that has a compiler, cmake and pip's LibTorch but none of these and no package registry
# (scripts/gpu_check.sh carries it there; docs/testing.md, "On a borrowed GPU machine").
#   - binary packages, unpacked with dpkg -x (nothing is installed here): yaml-cpp, fmt,
#     CLI11, nlohmann-json, Catch2 2, xxhash, protobuf with protoc, zlib, libpng, libjpeg,
#     and Gloo's headers (the pip wheels ship ProcessGroupGloo.hpp without them);
#   - OpenCV core/imgproc/imgcodecs built from Debian's source package: static, PNG/JPEG/BMP
#     only, against the kit's own static zlib/libpng/libjpeg (Debian's binary OpenCV pulls
#     in GDAL, OpenEXR, TIFF, WebP and more: hundreds of MiB).
# Static libraries wherever Debian ships them; the few shared ones (yaml-cpp, fmt, protobuf
# for protoc) sit in .kit/usr/lib/x86_64-linux-gnu, which the build's RPATH names.
# Idempotent: a part already made is kept (.kit/.done-PART); SANA_KIT_REBUILD=1 starts over.
# Prints what it holds and its size; fails above SANA_KIT_MAX_MIB (48).
#   bash scripts/device_kit.sh [KIT_DIR]       (default: .kit in the repository root)
# Environment: SANA_KIT_MIRROR (http://deb.debian.org/debian), SANA_KIT_JOBS (nproc).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
kit=$(mkdir -p "${1:-$root/.kit}" && cd "${1:-$root/.kit}" && pwd)
mirror=${SANA_KIT_MIRROR:-http://deb.debian.org/debian}
jobs=${SANA_KIT_JOBS:-$(nproc)}
max_mib=${SANA_KIT_MAX_MIB:-48}
arch=x86_64-linux-gnu
say() { echo "device_kit: $*"; }
die() { echo "device_kit: $*" >&2; exit 1; }
start=$(date +%s)

[ "$(uname -m)" = x86_64 ] || die "the kit is for x86-64 GPU machines; this machine is $(uname -m)"
for tool in apt-get dpkg cmake c++ xz tar; do
  command -v "$tool" > /dev/null || die "needs $tool"
done
# Downloads and the OpenCV build go beside the kit (KIT_DIR.work), so that what travels is
# the kit alone.
work=$kit.work
[ "${SANA_KIT_REBUILD:-0}" = 1 ] && rm -rf "${kit:?}"/* "$kit"/.done-* "$work"
mkdir -p "$work"
prefix=$kit/usr

# apt with its own sources, state and cache: downloads only, nothing installed.
apt_dir=$work/apt
mkdir -p "$apt_dir/etc" "$apt_dir/state/lists/partial" "$apt_dir/cache/archives/partial"
cat > "$apt_dir/etc/sources.list" <<EOF
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main
deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main
EOF
apt_opts=(-q -o "Dir::Etc::sourcelist=$apt_dir/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
          -o "Dir::State=$apt_dir/state" -o "Dir::Cache=$apt_dir/cache" -o Dir::State::status=/dev/null
          -o APT::Sandbox::User=root -o Debug::NoLocking=1)
apt_updated=0
apt_update() {
  [ "$apt_updated" = 1 ] && return 0
  apt-get "${apt_opts[@]}" update > "$work/apt-update.log" 2>&1 ||
    { cat "$work/apt-update.log" >&2; die "apt-get update against $mirror failed (set SANA_KIT_MIRROR)"; }
  apt_updated=1
}

# ---- Binary packages ----------------------------------------------------------------------
# Each: Debian package, then what of it the kit keeps (paths under usr/).
packages=(
  libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libcli11-dev nlohmann-json3-dev catch2
  libxxhash-dev libprotobuf-dev libprotobuf32 protobuf-compiler libprotoc32
  zlib1g-dev libpng-dev libjpeg62-turbo-dev libgloo-dev
)
if [ ! -f "$kit/.done-debs" ]; then
  apt_update
  mkdir -p "$work/debs"
  say "downloading ${#packages[@]} packages from $mirror (bookworm)"
  (cd "$work/debs" && apt-get "${apt_opts[@]}" download "${packages[@]}" > "$work/download.log" 2>&1) ||
    { cat "$work/download.log" >&2; die "apt-get download failed"; }
  rm -rf "$work/unpack" && mkdir -p "$work/unpack"
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/unpack"; done
  # Over what is there: OpenCV's install in the same prefix stays (SANA_KIT_REBUILD=1 starts
  # from nothing).
  mkdir -p "$prefix"
  cp -a "$work/unpack/usr/include" "$work/unpack/usr/bin" "$prefix/"
  # The multiarch headers (libjpeg's jconfig.h) where an include folder of the kit finds
  # them: a compiler looks in /usr/include/x86_64-linux-gnu only.
  cp -a "$prefix/include/$arch/." "$prefix/include/" && rm -rf "${prefix:?}/include/$arch"
  mkdir -p "$prefix/lib/$arch" "$prefix/share"
  cp -a "$work/unpack/usr/lib/$arch/." "$prefix/lib/$arch/"
  cp -a "$work/unpack/usr/lib/cmake" "$work/unpack/usr/lib/libCatch2WithMain.a" "$prefix/lib/"  # Catch2
  cp -a "$work/unpack/usr/share/cmake" "$prefix/share/"      # CLI11, nlohmann_json, Gloo
  # Static zlib, libpng, libjpeg, xxhash, protobuf: without the .so links CMake's
  # find_library takes the .a here before the system's shared ones.
  rm -f "$prefix/lib/$arch"/lib{z,png,png16,jpeg,xxhash,protobuf,protobuf-lite,protoc}.so
  # Not used: pkg-config files, Gloo's and Catch2's libraries (headers only), docs, tools.
  rm -rf "$prefix/lib/$arch/pkgconfig" "$prefix/share/cmake/Gloo" "$work/unpack/usr/lib/libgloo.so"
  # libprotobuf-lite.a is what sana-train links (the TensorBoard events); libprotobuf.a what
  # Debian's LibTorch asks for. yaml-cpp's CMake files name its shared library, not the .a.
  rm -f "$prefix/lib/$arch"/libyaml-cpp.a "$prefix/bin"/libpng*-config
  touch "$kit/.done-debs"
fi

# {fmt} in a prefix of its own (.kit/fmt/usr): a LibTorch that ships fmt headers (pip's
# fmt 12) must not find Debian's fmt 9 headers ahead of its own through the shared include
# folder; CMake uses this one only for a LibTorch without them (CMakeLists.txt).
if [ -d "$prefix/include/fmt" ]; then
  rm -rf "$kit/fmt" && mkdir -p "$kit/fmt/usr/include" "$kit/fmt/usr/lib/$arch/cmake"
  mv "$prefix/include/fmt" "$kit/fmt/usr/include/"
  mv "$prefix/lib/$arch/cmake/fmt" "$kit/fmt/usr/lib/$arch/cmake/"
  mv "$prefix/lib/$arch"/libfmt.so* "$kit/fmt/usr/lib/$arch/"
fi

# ---- OpenCV from Debian's source package --------------------------------------------------
if [ ! -f "$kit/.done-opencv" ]; then
  apt_update
  mkdir -p "$work/src"
  if ! compgen -G "$work/src/opencv_*.orig.tar.xz" > /dev/null; then
    say "downloading Debian's opencv source package"
    (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only opencv > "$work/source.log" 2>&1) ||
      { cat "$work/source.log" >&2; die "apt-get source opencv failed"; }
  fi
  orig=$(ls "$work"/src/opencv_*.orig.tar.xz | grep -v contrib | head -n 1)
  rm -rf "$work/opencv" && mkdir -p "$work/opencv"
  tar -xJf "$orig" -C "$work/opencv" --strip-components=1
  say "building OpenCV $(basename "$orig" | sed 's/opencv_\(.*\)\.orig.*/\1/') (core, imgproc, imgcodecs; static) with $jobs jobs"
  generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  # Only PNG, JPEG and the built-in BMP codecs; every optional dependency off, and nothing
  # fetched (IPP, ADE and the like download at configure time otherwise).
  cmake -S "$work/opencv" -B "$work/opencv-build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON \
    -DBUILD_SHARED_LIBS=OFF -DBUILD_LIST=core,imgproc,imgcodecs \
    -DBUILD_TESTS=OFF -DBUILD_PERF_TESTS=OFF -DBUILD_EXAMPLES=OFF -DBUILD_DOCS=OFF -DBUILD_opencv_apps=OFF \
    -DBUILD_JAVA=OFF -DBUILD_opencv_python3=OFF -DBUILD_opencv_python2=OFF -DOPENCV_GENERATE_PKGCONFIG=OFF \
    -DBUILD_ZLIB=OFF -DBUILD_PNG=OFF -DBUILD_JPEG=OFF -DBUILD_TIFF=OFF -DBUILD_WEBP=OFF -DBUILD_OPENJPEG=OFF \
    -DZLIB_LIBRARY="$prefix/lib/$arch/libz.a" -DZLIB_INCLUDE_DIR="$prefix/include" \
    -DPNG_LIBRARY="$prefix/lib/$arch/libpng16.a" -DPNG_PNG_INCLUDE_DIR="$prefix/include" \
    -DJPEG_LIBRARY="$prefix/lib/$arch/libjpeg.a" -DJPEG_INCLUDE_DIR="$prefix/include" \
    -DWITH_PNG=ON -DWITH_JPEG=ON -DWITH_TIFF=OFF -DWITH_WEBP=OFF -DWITH_OPENJPEG=OFF -DWITH_JASPER=OFF \
    -DWITH_OPENEXR=OFF -DWITH_IMGCODEC_HDR=OFF -DWITH_IMGCODEC_SUNRASTER=OFF -DWITH_IMGCODEC_PXM=OFF \
    -DWITH_IMGCODEC_PFM=OFF -DWITH_GDAL=OFF -DWITH_GDCM=OFF -DWITH_IPP=OFF -DWITH_ITT=OFF -DWITH_OPENCL=OFF \
    -DWITH_EIGEN=OFF -DWITH_LAPACK=OFF -DWITH_PROTOBUF=OFF -DWITH_ADE=OFF -DWITH_QUIRC=OFF -DWITH_OPENMP=OFF \
    -DWITH_TBB=OFF -DWITH_VA=OFF -DWITH_VA_INTEL=OFF -DWITH_GTK=OFF -DWITH_QT=OFF -DWITH_FFMPEG=OFF \
    -DWITH_GSTREAMER=OFF -DWITH_V4L=OFF -DWITH_1394=OFF -DWITH_CUDA=OFF -DWITH_OPENVX=OFF -DWITH_VTK=OFF \
    -DWITH_CAROTENE=OFF -DWITH_KLEIDICV=OFF -DCPU_DISPATCH=AVX2 -DOPENCV_DOWNLOAD_TRIES_LIST= \
    > "$work/opencv-configure.log" 2>&1 || { tail -n 40 "$work/opencv-configure.log" >&2; die "OpenCV configure failed: $work/opencv-configure.log"; }
  cmake --build "$work/opencv-build" -j "$jobs" > "$work/opencv-build.log" 2>&1 ||
    { tail -n 40 "$work/opencv-build.log" >&2; die "OpenCV build failed: $work/opencv-build.log"; }
  cmake --install "$work/opencv-build" > "$work/opencv-install.log" 2>&1 ||
    { tail -n 20 "$work/opencv-install.log" >&2; die "OpenCV install failed"; }
  # Relocatable: the static modules name the kit's zlib/libpng/libjpeg by absolute path;
  # make those paths relative to the installed config, wherever the kit is carried.
  grep -rl "$prefix" "$prefix/lib/cmake/opencv4" | while read -r file; do
    sed -i "s|$prefix|\${_IMPORT_PREFIX}|g" "$file"
  done
  if grep -rq "$prefix" "$prefix/lib/cmake/opencv4"; then
    die "OpenCV's CMake files still name $prefix"
  fi
  rm -rf "$prefix/share/opencv4" "$prefix/share/licenses" "$prefix/bin/setup_vars_opencv4.sh"
  rm -rf "$work/opencv" "$work/opencv-build"
  touch "$kit/.done-opencv"
fi

# ---- What it holds ------------------------------------------------------------------------
strip --strip-debug "$prefix"/lib/$arch/*.a "$prefix"/lib/*.a 2> /dev/null || true
rm -rf "$work/unpack"
cat > "$kit/README" <<EOF
sana-train's dependency kit, made by scripts/device_kit.sh on $(date -u +%Y-%m-%d) from Debian 12
packages (bookworm, $mirror). Use: cmake -DCMAKE_PREFIX_PATH="$kit/usr;$kit/fmt/usr;<LibTorch prefix>".
EOF
size_kib=$(du -sk "$kit" | cut -f1)
say "$kit holds ($(( $(date +%s) - start )) s):"
for deb in "${packages[@]}"; do printf '  %s\n' "$deb"; done
cv_version=$(awk '/#define CV_VERSION_(MAJOR|MINOR|REVISION) / { v = v (v == "" ? "" : ".") $3 } END { print v }' \
  "$prefix/include/opencv4/opencv2/core/version.hpp")
echo "  OpenCV $cv_version core/imgproc/imgcodecs, static (from Debian's source package)"
ls "$prefix/lib/$arch" "$prefix/lib" "$kit/fmt/usr/lib/$arch" | grep -E '\.(a|so[.0-9]*)$' | sort | tr '\n' ' ' | fold -s -w 100 | sed 's/^/    /'
echo
say "size: $(( size_kib / 1024 )) MiB (limit $max_mib MiB; downloads and build stay in $work)"
[ "$size_kib" -le $(( max_mib * 1024 )) ] || die "the kit is over $max_mib MiB"
