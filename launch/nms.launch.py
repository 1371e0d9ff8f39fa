"""lidar_kernels `nms` node. NMS over box records (PointCloud2: x y z length width height yaw score label). Outputs ~/boxes (kept box records) and ~/markers (visualization_msgs/MarkerArray).

ros2 launch lidar_kernels nms.launch.py params_file:=/path/orin.param.yaml boxes_in:=/sensor/topic
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    return LaunchDescription([
        DeclareLaunchArgument(
            'params_file',
            default_value=PathJoinSubstitution([FindPackageShare('lidar_kernels'), 'config', 'auto.param.yaml']),
            description='Node parameters (config/auto|orin|xavier|desktop_gpu|cpu.param.yaml or your own); QoS too.'),
        DeclareLaunchArgument(
            'dds_profile',
            default_value=EnvironmentVariable('FASTRTPS_DEFAULT_PROFILES_FILE', default_value=PathJoinSubstitution(
                [FindPackageShare('lidar_kernels'), 'config', 'fastdds_large_clouds.xml'])),
            description="Fast DDS profile of the node (default: the environment's, else the package's large-cloud profile)."),
        SetEnvironmentVariable('FASTRTPS_DEFAULT_PROFILES_FILE', LaunchConfiguration('dds_profile')),
        DeclareLaunchArgument('boxes_in', default_value='/detections/boxes', description='Input box-record PointCloud2 topic.'),
        DeclareLaunchArgument('namespace', default_value='', description='Namespace of the node.'),
        DeclareLaunchArgument('node_name', default_value='nms', description='Name of the node.'),
        Node(
            package='lidar_kernels',
            executable='nms',
            name=LaunchConfiguration('node_name'),
            namespace=LaunchConfiguration('namespace'),
            output='screen',
            parameters=[LaunchConfiguration('params_file')],
            remappings=[('boxes_in', LaunchConfiguration('boxes_in'))],
        ),
    ])
