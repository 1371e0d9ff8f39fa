"""lidar_kernels `detector` node. Boxes from the lidar alone: ground, clusters, boxes, rotated NMS. Outputs ~/detections (box records), ~/clusters, ~/markers (visualization_msgs/MarkerArray) and ~/detections_3d (vision_msgs/Detection3DArray, where the ROS environment has vision_msgs).

ros2 launch lidar_kernels detector.launch.py params_file:=/path/orin.param.yaml points:=/sensor/topic
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
        DeclareLaunchArgument('points', default_value='/points', description='Input PointCloud2 topic.'),
        DeclareLaunchArgument('namespace', default_value='', description='Namespace of the node.'),
        DeclareLaunchArgument('node_name', default_value='detector', description='Name of the node.'),
        Node(
            package='lidar_kernels',
            executable='detector',
            name=LaunchConfiguration('node_name'),
            namespace=LaunchConfiguration('namespace'),
            output='screen',
            parameters=[LaunchConfiguration('params_file')],
            remappings=[('points', LaunchConfiguration('points'))],
        ),
    ])
